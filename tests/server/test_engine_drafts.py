"""Drafts of forced text in the engine, on the embedded model: outputs byte-identical to
feeding one token per forward pass, in fewer passes, alone and batched, greedy and seeded."""

from __future__ import annotations

import asyncio

import pytest
import torch

from bench.drafts import generate
from gclm.compiler.front.constraint import Constraint
from gclm.server.engine.protocol import GenerationRequest, PreparedConstraint, SamplingParams
from gclm.server.engine.transformers.engine import BatchEngine

SCHEMA = {
    "type": "object",
    "properties": {
        "customer_full_name": {"type": "string", "maxLength": 12},
        "shipping_address_line": {"type": "string", "maxLength": 12},
        "number_of_items_ordered": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["customer_full_name", "shipping_address_line", "number_of_items_ordered"],
}


@pytest.fixture(scope="module")
def engines(float32_engine, embedded_tokenizer):
    return {drafts: float32_engine(drafts) for drafts in (0, 8)}, embedded_tokenizer


def run(engine: BatchEngine, requests: list[GenerationRequest]) -> list[tuple[str, str, int]]:
    """(text, finish reason, completion tokens) of requests submitted together."""

    async def one(request: GenerationRequest) -> tuple[str, str, int]:
        text, finish = await generate(engine, request)
        return text, finish.finish_reason, finish.completion_tokens

    async def all_of() -> list[tuple[str, str, int]]:
        return list(await asyncio.gather(*(one(r) for r in requests)))

    return asyncio.run(all_of())


def requests(tokenizer, table, seeds: list[int | None], max_tokens: int = 80):
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Invent one order as JSON."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = tokenizer.encode(prompt)
    return [
        GenerationRequest(
            prompt_ids=ids,
            params=SamplingParams(
                max_tokens=max_tokens,
                temperature=0.0 if seed is None else 0.8,
                seed=seed,
            ),
            constraint=PreparedConstraint.of(table),
        )
        for seed in seeds
    ]


@torch.no_grad()
def test_drafts_change_nothing_but_the_number_of_forward_passes(engines):
    built, tokenizer = engines
    table = built[0].constraints.cache.get(Constraint.json_schema(SCHEMA))
    results, passes, kept = {}, {}, {}
    for drafts, engine in built.items():
        before = engine.stats()
        alone = run(engine, requests(tokenizer, table, [None]))
        batched = run(engine, requests(tokenizer, table, [None, 7, 11]))
        tight = run(engine, requests(tokenizer, table, [None], max_tokens=table.min_tokens + 2))
        after = engine.stats()
        results[drafts] = alone + batched + tight
        passes[drafts] = after.gauges["forward_passes"] - before.gauges["forward_passes"]
        kept[drafts] = after.gauges["draft_tokens_kept"] - before.gauges["draft_tokens_kept"]
    assert results[8] == results[0]
    assert all(reason == "stop" for _, reason, _ in results[8])
    assert '"customer_full_name"' in results[8][0][0]
    assert kept[0] == 0 and kept[8] > 20
    assert passes[8] < passes[0]
