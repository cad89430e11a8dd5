"""Requests on a BatchEngine for the engine tests: greedy requests over random prompts, the
ids a request streams, and engines on one tiny random Llama."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gclm.compiler.service.cache import TableCache
from gclm.compiler.whole.compile import compile_constraint
from gclm.server.engine.protocol import (
    ErrorEvent,
    FinishEvent,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from gclm.server.engine.transformers.engine import BatchEngine


def tiny_builder(tokenizer: Any, vocab: Any, tiny_llama: Any) -> Callable[..., BatchEngine]:
    """`build(max_batched_tokens, prefill_thread)`: an engine on one tiny random Llama in
    float32 (the same model and table cache for every engine built), 4 slots, no drafts."""
    model = tiny_llama(
        vocab_size=vocab.size, max_position_embeddings=512, eos_token_id=tokenizer.eos_token_id
    )
    cache = TableCache(lambda c: compile_constraint(c, vocab), vocab.fingerprint)

    def build(max_batched_tokens: int, prefill_thread: bool) -> BatchEngine:
        return BatchEngine(
            model,
            tokenizer,
            model_id="tiny",
            vocab=vocab,
            cache=cache,
            max_batch=4,
            kv_memory=16 << 20,
            draft_tokens=0,
            max_batched_tokens=max_batched_tokens,
            prefill_thread=prefill_thread,
        )

    return build


def greedy(prompt: list[int], max_tokens: int = 12) -> GenerationRequest:
    return GenerationRequest(
        prompt_ids=prompt, params=SamplingParams(max_tokens=max_tokens, temperature=0.0)
    )


def prompts(count: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(10, 40000, (length,), generator=g).tolist() for _ in range(count)]


async def ids_of(engine: BatchEngine, request: GenerationRequest) -> list[int]:
    """The ids `request` streams; raises its error."""
    return await collect(engine, engine.submit(request))


async def collect(engine: BatchEngine, handle: Any, ids: list[int] | None = None) -> list[int]:
    """The ids a submitted request streams, appended to `ids` as they come; raises its
    error."""
    ids = [] if ids is None else ids
    async for event in engine.stream(handle):
        if isinstance(event, TokenEvent):
            ids.extend(event.token_ids)
        elif isinstance(event, FinishEvent):
            return ids
        else:
            assert isinstance(event, ErrorEvent)
            raise event.error
    raise AssertionError("no finish event")
