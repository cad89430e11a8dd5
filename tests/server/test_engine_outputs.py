"""The engine's greedy outputs do not change with its step's bookkeeping: six requests at
once on a tiny random Llama (unconstrained, a regex, a JSON Schema; prompts and budgets of
different lengths, so rows join and leave the batch), without and with drafts, give the
ids the engine gave at 1e457d6, before the step's hand-offs, logits views and greedy
sampling changed (issue 57)."""

from __future__ import annotations

import asyncio

import pytest
import torch
from engine_runs import ids_of

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.service.cache import TableCache
from gclm.compiler.whole.compile import compile_constraint
from gclm.server.engine.protocol import GenerationRequest, PreparedConstraint, SamplingParams
from gclm.server.engine.transformers.engine import BatchEngine

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
# The ids 1e457d6's engine streamed for REQUESTS (the same with drafts and without).
# fmt: off
EXPECTED = [
    [19325, 33436, 22015, 19882, 26780, 24399, 37056, 48980, 40344, 11349, 5252, 1979, 10153,
     25897, 34665, 35687, 31915, 23639, 19540, 10552],
    [43510, 9952, 15318, 33765, 15156, 36252, 3493, 18733, 3926, 35478, 42012, 47481, 18214,
     11522, 28641, 12260],
    [39428, 94, 81, 93, 85, 1799, 1002, 40065, 46846, 129, 18, 1627, 81, 361, 1799, 37, 40, 32,
     38, 37, 40, 32, 38, 37, 40, 32, 38, 37, 40, 109],
    [35758, 39920, 8124, 30442, 48627, 43579, 36623, 31695, 30419, 37465, 16915, 11831, 1828,
     6234, 23123, 35606, 14132, 37486, 44919, 46651, 14619, 32305, 2501, 10802, 2573],
    [107, 216, 18, 94, 81, 93, 85, 1799, 48037, 13611, 18, 1627, 81, 361, 1799, 37, 40, 32, 38,
     37, 40, 32, 38, 109],
    [10381, 22917, 17049, 49070, 24742, 19162, 1295, 2314, 13394, 27420],
]
# fmt: on


@pytest.fixture(scope="module")
def model(embedded_tokenizer, embedded_vocab, tiny_llama):
    return tiny_llama(
        vocab_size=embedded_vocab.size,
        max_position_embeddings=512,
        eos_token_id=embedded_tokenizer.eos_token_id,
    )


def requests(vocab) -> list[GenerationRequest]:
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(10, 40000, (n,), generator=g).tolist() for n in (5, 9, 12, 20, 7, 33)]
    regex = compile_constraint(Constraint.regex("[a-z ]+"), vocab)
    schema = compile_constraint(Constraint.json_schema(SCHEMA), vocab)
    tables = [None, regex, schema, None, schema, regex]
    budgets = [20, 16, 30, 25, 24, 10]
    return [
        GenerationRequest(
            p,
            SamplingParams(max_tokens=n, temperature=0.0),
            constraint=None if t is None else PreparedConstraint.of(t),
        )
        for p, t, n in zip(prompts, tables, budgets, strict=True)
    ]


@pytest.mark.parametrize("drafts", [0, 8])
def test_greedy_outputs_are_those_of_before(model, embedded_tokenizer, embedded_vocab, drafts):
    vocab = embedded_vocab
    cache = TableCache(lambda c: compile_constraint(c, vocab), vocab.fingerprint)
    engine = BatchEngine(
        model,
        embedded_tokenizer,
        model_id="tiny",
        vocab=vocab,
        cache=cache,
        max_batch=8,
        kv_memory=16 << 20,
        draft_tokens=drafts,
    )

    async def together() -> list[list[int]]:
        return list(await asyncio.gather(*(ids_of(engine, r) for r in requests(vocab))))

    try:
        assert asyncio.run(together()) == EXPECTED
    finally:
        engine.shutdown()
