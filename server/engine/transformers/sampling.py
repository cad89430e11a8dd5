"""Sampling for a batch: greedy, temperature and top_p per row, seeds per row."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Protocol

import torch


class _Row(Protocol):
    generator: torch.Generator | None

    @property
    def request(self): ...  # noqa: ANN201


def sample(logits: torch.Tensor, rows: Seq[_Row]) -> list[int]:
    """One token per row of masked logits [B, V]. Temperature 0 is greedy."""
    temperatures = [r.request.params.temperature for r in rows]
    out = greedy_ids(logits)  # [B]
    if max(temperatures, default=0.0) <= 1e-5:  # all greedy: no tensors of parameters
        return out.tolist()
    temps = torch.tensor(temperatures, device=logits.device)
    top_p = torch.tensor([r.request.params.top_p for r in rows], device=logits.device)
    hot = torch.nonzero(temps > 1e-5).flatten()
    if hot.numel():
        scaled = logits[hot] / temps[hot, None]  # [H, V]
        probs = torch.softmax(_top_p(scaled, top_p[hot]), dim=-1)
        out[hot] = _draw(probs, [rows[r].generator for r in hot.tolist()])
    return out.tolist()


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """The index of each row's largest logit, [B] int64: the first of equal maxima, a NaN
    before any number, as torch's and numpy's argmax both define it.

    On the CPU numpy's argmax is vectorised and torch's is not: [64, 49152] float32 on one
    AVX2 thread took 0.4 ms against 3.7 ms, about 12% of a 2-layer model's step at batch 64.
    """
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return torch.from_numpy(logits.numpy().argmax(axis=-1))
    return logits.argmax(dim=-1)


def _draw(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row of `probs` [H, V], by inverse CDF: one uniform number per row, from
    the row's own generator when it has one (so a seeded row draws the same alone or in any
    batch), all rows looked up in one batched search. A token of probability 0 (masked) is
    never drawn: the first position whose cumulative sum exceeds the draw adds mass."""
    uniform = torch.rand(len(generators))
    for i, gen in enumerate(generators):
        if gen is not None:
            uniform[i] = torch.rand((), generator=gen)
    cdf = probs.cumsum(dim=-1)  # [H, V], non-decreasing
    # Strictly below each row's total, which rounding could otherwise reach.
    target = uniform.to(probs.device) * cdf[:, -1] * (1 - 2**-20)
    picked = torch.searchsorted(cdf, target[:, None], right=True).squeeze(1)
    return picked.clamp_(max=probs.shape[-1] - 1)


def _top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability reaches top_p, per row."""
    if bool((top_p >= 1).all()):
        return logits
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    probs = torch.softmax(sorted_logits, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # mass strictly before each token
    drop = before > top_p[:, None]  # the first token is never dropped
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)
