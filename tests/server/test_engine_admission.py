"""Admission into a running batch, on the embedded model: a prompt whose prefix a slot kept
joins the running rows' decode pass (one forward pass, not two), a long new prompt gets a
pass of its own, and either way every output is the one the request gives alone."""

from __future__ import annotations

import asyncio

import pytest
import torch
from pass_spy import Packed

from bench.drafts import generate
from gclm.compiler.front.constraint import Constraint
from gclm.server.engine.protocol import (
    GenerationRequest,
    PreparedConstraint,
    SamplingParams,
    TokenEvent,
)
from gclm.server.engine.transformers.engine import BatchEngine

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


@pytest.fixture(scope="module")
def engine(float32_engine):
    return float32_engine(0)  # no drafts: every pass feeds one token per running row


def request(engine: BatchEngine, content: str) -> GenerationRequest:
    text = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    return GenerationRequest(
        prompt_ids=engine.tokenizer.encode(text),
        params=SamplingParams(max_tokens=40, temperature=0.0),
        constraint=PreparedConstraint.of(
            engine.constraints.cache.get(Constraint.json_schema(SCHEMA))
        ),
    )


async def staggered(engine: BatchEngine, first: GenerationRequest, second: GenerationRequest):
    """Both texts, `second` submitted once `first` has streamed three tokens."""
    handle = engine.submit(first)
    texts, later = [], None
    async for event in engine.stream(handle):
        if isinstance(event, TokenEvent):
            texts.append(event.text)
            if len(texts) == 3:
                later = asyncio.ensure_future(generate(engine, second))
    assert later is not None
    second_text, _ = await later
    return "".join(texts), second_text


@torch.no_grad()
def test_a_repeated_prompt_joins_the_decode_pass(engine, passes):
    first = request(engine, "Invent a person as JSON.")
    second = request(engine, "Invent a cat as JSON.")
    alone = [asyncio.run(generate(engine, r))[0] for r in (first, second)]
    passes.clear()
    # `second`'s prompt is in a released slot: one token of it is left to run.
    together = asyncio.run(staggered(engine, first, second))
    assert list(together) == alone
    joined = [p for p in passes if len(p) == 2 and sorted(p.values()) == [1, 1]]
    assert joined, passes  # the admitted row's last prompt token rode with a decode row
    assert not any(len(p) == 1 and max(p.values()) > 1 for p in passes[1:])  # no own prefill


@torch.no_grad()
def test_a_long_new_prompt_is_packed_beside_the_decode_rows(engine, passes):
    """A long prompt's rest never pads the decode rows to its length: on the CPU it shares
    one packed pass with them (KVStore.extend_packed), elsewhere it gets a pass of its own."""
    first = request(engine, "Invent a person as JSON.")
    fresh = request(engine, "Describe, as JSON, a librarian who collects maps of rivers.")
    alone_first = asyncio.run(generate(engine, first))[0]
    passes.clear()
    together = asyncio.run(staggered(engine, first, fresh))
    assert together[0] == alone_first
    prefills = [p for p in passes[1:] if max(p.values()) > 8]
    assert len(prefills) == 1, passes  # the new prompt's rest, in one pass
    assert isinstance(prefills[0], Packed) and sorted(prefills[0].values())[0] == 1, passes
    assert not any(len(p) > 1 and max(p.values()) > 8 for p in passes if not isinstance(p, Packed))
    passes.clear()
    assert asyncio.run(generate(engine, fresh))[0] == together[1]
