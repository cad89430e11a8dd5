"""The engine's BudgetPolicy seam, on a tiny random Llama over the embedded tokenizer.

A policy sees every budget-aware constrained row after the mask, with its state, tokens left
and budget, and may reweight its logits; rows without a policy are left alone.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from gclm.compiler.front.constraint import Constraint
from gclm.masking.state import ConstraintState
from gclm.server.engine.protocol import (
    FinishEvent,
    GenerationRequest,
    PreparedConstraint,
    SamplingParams,
    TokenEvent,
)
from gclm.server.engine.transformers.engine import BatchEngine


@pytest.fixture(scope="module")
def engine(tiny_batch_engine):
    engine = tiny_batch_engine()
    yield engine
    engine.shutdown()


class Prefer:
    """Adds `bonus` to one token wherever the mask allows it; records what it was shown."""

    def __init__(self, token: int, bonus: float = 1e4) -> None:
        self.token, self.bonus = token, bonus
        self.calls: list[tuple[int, int, int]] = []

    def adjust(self, logits, state: ConstraintState, tokens_left: int, budget: int) -> None:
        self.calls.append((state.state, tokens_left, budget))
        if torch.isfinite(logits[self.token]):
            logits[self.token] += self.bonus


def generate(engine: BatchEngine, request: GenerationRequest) -> tuple[str, str]:
    async def run() -> tuple[str, str]:
        handle = engine.submit(request)
        text, reason = [], ""
        async for event in engine.stream(handle):
            if isinstance(event, TokenEvent):
                text.append(event.text)
            elif isinstance(event, FinishEvent):
                reason = event.finish_reason
            else:
                raise event.error
        return "".join(text), reason

    return asyncio.run(run())


def test_policy_steers_inside_the_mask(engine, embedded_tokenizer) -> None:
    table = engine.constraints.cache.get(Constraint.choice([" alpha", " beta"]))
    prompt = embedded_tokenizer.encode("Pick:")
    outputs = set()
    for word in (" alpha", " beta"):
        first = embedded_tokenizer.encode(word)[0]
        policy = Prefer(first)
        request = GenerationRequest(
            prompt_ids=prompt,
            params=SamplingParams(max_tokens=8, temperature=0.0),
            constraint=PreparedConstraint.of(table, policy=policy),
        )
        text, reason = generate(engine, request)
        assert (text, reason) == (word, "stop")
        assert policy.calls[0] == (table.initial, 8, 8)
        assert [left for _, left, _ in policy.calls] == list(range(8, 8 - len(policy.calls), -1))
        outputs.add(text)
    assert outputs == {" alpha", " beta"}


def test_policy_cannot_unmask_and_is_skipped_without_a_budget(engine, embedded_tokenizer):
    table = engine.constraints.cache.get(Constraint.regex("[0-9]{2}"))
    letter = embedded_tokenizer.encode("x")[0]  # never allowed by the mask
    policy = Prefer(letter)
    request = GenerationRequest(
        prompt_ids=embedded_tokenizer.encode("Two digits:"),
        params=SamplingParams(max_tokens=4, temperature=0.0),
        constraint=PreparedConstraint.of(table, policy=policy),
    )
    text, reason = generate(engine, request)
    assert len(text) == 2 and text.isdigit() and reason == "stop"
    assert policy.calls
    unaware = Prefer(letter)
    request.constraint = PreparedConstraint.of(table, budget_aware=False, policy=unaware)
    generate(engine, request)
    assert unaware.calls == []
