"""sample(): greedy rows take the argmax; hot rows draw from the masked distribution, never
a masked token, and a seeded row draws the same alone or batched."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gclm.server.engine.protocol import SamplingParams
from gclm.server.engine.transformers.sampling import greedy_ids, sample


@dataclass
class Request:
    params: SamplingParams


@dataclass
class Row:
    params: SamplingParams
    generator: torch.Generator | None = None
    request: Request = field(init=False)

    def __post_init__(self) -> None:
        self.request = Request(self.params)


def row(temperature: float = 1.0, seed: int | None = None, top_p: float = 1.0) -> Row:
    params = SamplingParams(max_tokens=8, temperature=temperature, top_p=top_p, seed=seed)
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return Row(params, generator)


def test_greedy_rows_take_the_argmax():
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, -1.0, 4.9]])
    assert sample(logits, [row(0.0), row(0.0)]) == [1, 0]


def test_draws_follow_the_distribution_and_skip_masked_tokens():
    inf = float("-inf")
    # Token 1 is masked; tokens 0 and 2 have probabilities 1/4 and 3/4.
    one = torch.tensor([0.0, inf, torch.log(torch.tensor(3.0)).item(), inf])
    logits = one.expand(4000, -1).clone()
    drawn = torch.tensor(sample(logits, [row() for _ in range(4000)]))
    assert set(drawn.tolist()) <= {0, 2}
    assert abs((drawn == 2).float().mean().item() - 0.75) < 0.03


def test_top_p_keeps_the_smallest_set_reaching_it():
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1])).expand(500, -1).clone()
    drawn = set(sample(logits, [row(top_p=0.5) for _ in range(500)]))
    assert drawn == {0}


def test_a_seeded_row_draws_the_same_alone_or_batched():
    torch.manual_seed(1)
    logits = torch.randn(6, 50)
    alone = [sample(logits[i : i + 1], [row(seed=100 + i)])[0] for i in range(6)]
    batched = sample(logits, [row(seed=100 + i) for i in range(6)])
    assert batched == alone
    # Other seeds draw other tokens somewhere in these rows (50 tokens, near-uniform).
    other = sample(logits, [row(seed=200 + i) for i in range(6)])
    assert other != alone


def test_greedy_ids_are_torchs_argmax_ties_nans_and_all() -> None:
    torch.manual_seed(0)
    inf, nan = float("inf"), float("nan")
    cases = [
        torch.randn(64, 49152),
        torch.randn(8, 101)[:, ::2],  # a view, not contiguous
        torch.tensor(
            [[1.0, 3.0, 3.0, 0.0], [-inf] * 4, [0.0, nan, 5.0, nan], [inf, 2.0, inf, 1.0]]
        ),
        torch.randn(2, 9, dtype=torch.bfloat16),  # torch's own argmax
    ]
    with torch.inference_mode():
        for logits in cases:
            assert torch.equal(greedy_ids(logits), logits.argmax(dim=-1))
