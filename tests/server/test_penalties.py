"""Penalties and logit_bias on a batch: exact values, untouched rows, and the mask after them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import torch
from fake_engine import tiny_table

from gclm.masking import allocate_bitmask, apply_bitmask, fill_bitmask
from gclm.masking.state import ConstraintState
from gclm.server.engine.protocol import GenerationRequest, SamplingParams
from gclm.server.engine.transformers.penalties import apply_penalties

V = 8


@dataclass
class Row:
    request: GenerationRequest
    output_ids: list[int] = field(default_factory=list)


def row(prompt: tuple[int, ...] = (0,), output: tuple[int, ...] = (), **params: object) -> Row:
    params = SamplingParams(max_tokens=8, **params)  # type: ignore[arg-type]
    return Row(GenerationRequest(prompt_ids=list(prompt), params=params), list(output))


def logits(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def test_rows_without_penalties_are_untouched() -> None:
    x = logits([1.0] * V, [2.0] * V)
    apply_penalties(x, [row(output=(1, 1)), row(output=(2,))])
    assert torch.equal(x, logits([1.0] * V, [2.0] * V))


def test_frequency_and_presence_penalties() -> None:
    x = torch.zeros(2, V)
    rows = [
        row(output=(3, 3, 3, 5), frequency_penalty=0.5),
        row(output=(3, 3, 3, 5), presence_penalty=0.25),
    ]
    apply_penalties(x, rows)
    expected = torch.zeros(2, V)
    expected[0, 3], expected[0, 5] = -1.5, -0.5
    expected[1, 3], expected[1, 5] = -0.25, -0.25
    assert torch.equal(x, expected)


def test_repetition_penalty_covers_prompt_and_output() -> None:
    x = logits([2.0, -2.0, 2.0, -2.0, 2.0, 0, 0, 0])
    apply_penalties(x, [row(prompt=(0, 1), output=(3,), repetition_penalty=2.0)])
    assert x[0].tolist() == [1.0, -4.0, 2.0, -4.0, 2.0, 0, 0, 0]


def test_logit_bias_adds_to_the_named_tokens_only() -> None:
    x = torch.zeros(1, V + 2)  # models pad their output layer past the vocabulary
    apply_penalties(x, [row(logit_bias=((2, 5.0), (7, -100.0)))])
    expected = torch.zeros(1, V + 2)
    expected[0, 2], expected[0, 7] = 5.0, -100.0
    assert torch.equal(x, expected)


def test_only_penalised_rows_change_in_a_mixed_batch() -> None:
    x = torch.ones(3, V)
    apply_penalties(x, [row(output=(4,)), row(output=(4,), frequency_penalty=1.0), row()])
    assert x[0].tolist() == [1.0] * V and x[2].tolist() == [1.0] * V
    assert x[1, 4] == 0.0 and x[1].sum() == V - 1


@pytest.mark.parametrize("bias", [100.0, -100.0])
def test_the_mask_after_the_penalties_keeps_the_output_valid(bias: float) -> None:
    """A bias cannot bring back a masked token, nor remove every allowed one."""
    table = tiny_table(min_tokens=3, vocab_size=V)
    state = ConstraintState(table)
    allowed = [t for t in range(V) if t == 1]  # the chain's first token
    x = torch.zeros(1, V)
    biased = tuple((t, bias if t in allowed else -bias) for t in range(V))
    apply_penalties(x, [row(logit_bias=biased, frequency_penalty=2.0, output=(1, 1))])
    bitmask = allocate_bitmask(1, V)
    fill_bitmask(bitmask, 0, state, 3)
    apply_bitmask(x, bitmask[:1])
    finite = [t for t in range(V) if math.isfinite(x[0, t].item())]
    assert finite == allowed
    assert int(x.argmax()) == 1


def test_presence_penalty_before_any_output_changes_nothing() -> None:
    x = torch.ones(2, V)
    apply_penalties(x, [row(presence_penalty=2.0), row(output=(5,), presence_penalty=2.0)])
    assert x[0].tolist() == [1.0] * V
    assert x[1, 5] == -1.0 and x[1].sum() == V - 2
