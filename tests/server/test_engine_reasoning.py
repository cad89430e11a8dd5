"""Thinking on the transformers engine with single-token markers: a tiny random Llama whose
tokenizer has `<think>` and `</think>` as added special tokens (as Qwen3 and DeepSeek-R1
have), served through the deepseek_r1 parser. At every budget from the minimum up the
answer is valid and complete; the marker is one token, and at the minimum it is forced at
once. (The plain-text, several-token markers are test_e2e_reasoning.py's.)"""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest
import torch
from transformers import AutoTokenizer

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.service.cache import TableCache
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.compile import compile_constraint
from gclm.masking.reasoning import ThinkingSpec
from gclm.server.engine.model_loader import embedded_model_dir
from gclm.server.engine.protocol import (
    ErrorEvent,
    FinishEvent,
    GenerationRequest,
    PreparedConstraint,
    SamplingParams,
    TokenEvent,
)
from gclm.server.engine.transformers.engine import BatchEngine
from gclm.server.openai.reasoning import ReasoningParser

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
    "required": ["ok", "n"],
}


@pytest.fixture(scope="module")
def thinking_engine(tiny_llama):
    tokenizer = AutoTokenizer.from_pretrained(str(embedded_model_dir()))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    vocab = TokenVocabulary.from_tokenizer(tokenizer)
    model = tiny_llama(
        vocab_size=len(tokenizer),
        max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id,
    )
    cache = TableCache(lambda c: compile_constraint(c, vocab), vocab.fingerprint)
    engine = BatchEngine(
        model, tokenizer, model_id="tiny", vocab=vocab, cache=cache, max_batch=4,
        kv_memory=16 << 20, draft_tokens=0,
    )  # fmt: skip
    yield engine, ReasoningParser.named("deepseek_r1", tokenizer)
    engine.shutdown()


async def generate(engine: BatchEngine, request: GenerationRequest) -> tuple[str, str, FinishEvent]:
    thought, answer = [], []
    async for event in engine.stream(engine.submit(request)):
        if isinstance(event, TokenEvent):
            (thought if event.reasoning else answer).append(event.text)
        elif isinstance(event, FinishEvent):
            return "".join(thought), "".join(answer), event
        elif isinstance(event, ErrorEvent):
            raise event.error
    raise AssertionError("no finish event")


@torch.no_grad()
def test_single_token_markers_think_then_answer_at_every_budget(thinking_engine) -> None:
    engine, parser = thinking_engine
    assert len(parser.end_ids) == 1  # `</think>` is one added token
    table = asyncio.run(engine.constraints.compile(Constraint.json_schema(SCHEMA)))
    spec = ThinkingSpec(parser.end_ids)
    minimum = spec.min_tokens(table)
    assert minimum == table.min_tokens + 1
    prompt = engine.tokenizer.encode("Think, then answer.<think>")

    async def run(budget: int, seed: int) -> tuple[str, str, FinishEvent]:
        params = SamplingParams(max_tokens=budget, temperature=1.0, seed=seed)
        return await generate(
            engine,
            GenerationRequest(
                prompt, params, constraint=PreparedConstraint.of(table), thinking=spec
            ),
        )

    for budget in range(minimum, minimum + 12):
        thought, answer, finish = asyncio.run(run(budget, seed=budget))
        jsonschema.validate(json.loads(answer), SCHEMA)
        assert finish.finish_reason == "stop" and finish.completion_tokens <= budget
        assert "</think>" not in thought + answer
        assert finish.reasoning_tokens is not None and finish.reasoning_tokens >= 1
        if budget == minimum:  # no room to think: the marker at once, then the shortest answer
            assert thought == "" and finish.reasoning_tokens == 1
            assert finish.completion_tokens == minimum
        else:  # room to think: a random model does (it never picks the marker by chance)
            assert finish.reasoning_tokens > 1 and thought
