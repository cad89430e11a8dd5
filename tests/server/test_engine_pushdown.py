"""A pushdown table (compiler/grown/pushdown.py) on the transformers engine: a row whose
table passes one of its limits mid-generation ends with that limit's error, and the rows
batched beside it go on to their ends."""

from __future__ import annotations

import asyncio

import torch
from engine_runs import collect

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.grammar.frames import grammar_frames
from gclm.compiler.grown import pushdown
from gclm.compiler.grown.pushdown import PushdownTable
from gclm.compiler.service.cache import TableCache
from gclm.compiler.whole.compile import compile_constraint
from gclm.errors import CompileLimitError
from gclm.server.engine.protocol import GenerationRequest, PreparedConstraint, SamplingParams
from gclm.server.engine.transformers.engine import BatchEngine

NESTED = 'start: t\nt: "(" t ")" | "x"'


def test_a_table_past_its_limit_fails_its_row_alone(
    monkeypatch, embedded_tokenizer, embedded_vocab, tiny_llama
):
    vocab = embedded_vocab
    model = tiny_llama(
        vocab_size=vocab.size,
        max_position_embeddings=512,
        eos_token_id=embedded_tokenizer.eos_token_id,
    )
    cache = TableCache(lambda c: compile_constraint(c, vocab), vocab.fingerprint)
    engine = BatchEngine(
        model, embedded_tokenizer, model_id="tiny", vocab=vocab, cache=cache, max_batch=4,
        kv_memory=16 << 20, draft_tokens=4,
    )  # fmt: skip
    frames = grammar_frames(NESTED)
    assert frames is not None
    table = PushdownTable.of_frames(frames, vocab)
    table.row(table.initial, 40)
    # The first walk made its states; the next few walks pass the limit.
    monkeypatch.setattr(pushdown, "MAX_PUSHDOWN_STATES", table.grown.states + 1)
    table.grown.max_states = table.grown.states + 1
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(10, 40000, (8,), generator=g).tolist()
    digits = compile_constraint(Constraint.regex("[0-9]{12}"), vocab)
    deep = GenerationRequest(
        prompt,
        SamplingParams(max_tokens=40, temperature=0.0),
        constraint=PreparedConstraint.of(table),
    )
    beside = [
        GenerationRequest(
            prompt, SamplingParams(max_tokens=12, temperature=0.0),
            constraint=PreparedConstraint.of(digits),
        )
        for _ in range(2)
    ]  # fmt: skip

    async def run() -> list[object]:
        handles = [engine.submit(r) for r in (deep, *beside)]
        return list(
            await asyncio.gather(*(collect(engine, h) for h in handles), return_exceptions=True)
        )

    try:
        failed, *others = asyncio.run(run())
    finally:
        engine.shutdown()
    assert isinstance(failed, CompileLimitError) and "automaton states" in str(failed)
    for ids in others:
        assert isinstance(ids, list) and len(ids) == 12
        assert vocab.decode(ids).isdigit()
