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
    temps = torch.tensor([r.request.params.temperature for r in rows], device=logits.device)
    top_p = torch.tensor([r.request.params.top_p for r in rows], device=logits.device)
    out = logits.argmax(dim=-1)  # [B]
    hot = torch.nonzero(temps > 1e-5).flatten()
    if hot.numel():
        scaled = logits[hot] / temps[hot, None]  # [H, V]
        probs = torch.softmax(_top_p(scaled, top_p[hot]), dim=-1)
        seeded = [i for i, r in enumerate(hot.tolist()) if rows[r].generator is not None]
        unseeded = [i for i in range(hot.numel()) if i not in set(seeded)]
        if unseeded:
            idx = torch.tensor(unseeded, device=logits.device)
            out[hot[idx]] = torch.multinomial(probs[idx], 1).flatten()
        for i in seeded:
            gen = rows[int(hot[i])].generator
            # Seeded rows draw on the CPU from their own generator: reproducible alone or batched.
            out[hot[i]] = torch.multinomial(probs[i].cpu(), 1, generator=gen).item()
    return out.tolist()


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
