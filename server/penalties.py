"""Penalties and logit_bias for a batch, applied to the raw logits before the constraint mask.

Because the mask comes after, a penalty or a bias can change which allowed token wins but
can never let a forbidden one through: a constrained output stays valid and complete.

The formulas are OpenAI's and vLLM's:

    logit[v] += logit_bias[v]
    logit[v] = logit[v] / r if logit[v] > 0 else logit[v] * r    for v seen in prompt or output
    logit[v] -= frequency_penalty * count[v] + presence_penalty * (count[v] > 0)

where count[v] counts v in the output so far and r is `repetition_penalty` (vLLM's extension,
as in Hugging Face's RepetitionPenaltyLogitsProcessor).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Protocol

import torch

from gclm.server.interface import GenerationRequest


class _Row(Protocol):
    request: GenerationRequest
    output_ids: list[int]


def apply_penalties(logits: torch.Tensor, rows: Seq[_Row]) -> None:
    """Penalise and bias `logits` [B, V] in place; row i belongs to rows[i].

    Only the rows that ask for a penalty or a bias are touched (one gather and one scatter).
    """
    picked = [i for i, r in enumerate(rows) if r.request.params.penalized]
    if not picked:
        return
    device, vocab = logits.device, logits.shape[1]
    params = [rows[i].request.params for i in picked]
    sub = logits[picked]  # [P, V]

    bias = torch.zeros_like(sub)  # [P, V]
    for j, p in enumerate(params):
        if p.logit_bias:
            ids, values = zip(*p.logit_bias, strict=True)
            bias[j, list(ids)] = torch.tensor(values, dtype=sub.dtype, device=device)
    sub += bias

    counts = _counts([rows[i].output_ids for i in picked], vocab, device)  # [P, V]
    rep = torch.tensor([p.repetition_penalty for p in params], device=device)[:, None]  # [P, 1]
    if bool((rep != 1.0).any()):
        seen = counts > 0
        seen |= _counts([rows[i].request.prompt_ids for i in picked], vocab, device) > 0
        penalised = torch.where(sub > 0, sub / rep, sub * rep)
        sub = torch.where(seen, penalised, sub)
    freq = torch.tensor([p.frequency_penalty for p in params], device=device)[:, None]
    presence = torch.tensor([p.presence_penalty for p in params], device=device)[:, None]
    sub -= freq * counts + presence * (counts > 0)
    logits[picked] = sub


def _counts(token_lists: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """[len(token_lists), vocab] float: how often each token occurs in each list."""
    width = max((len(t) for t in token_lists), default=0)
    # Padding goes to a spill column past the vocabulary, dropped at the end.
    ids = torch.full((len(token_lists), max(width, 1)), vocab, dtype=torch.long)
    for j, tokens in enumerate(token_lists):
        if tokens:
            ids[j, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    ids = ids.clamp_(max=vocab).to(device)
    counts = torch.zeros(len(token_lists), vocab + 1, device=device)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=counts.dtype))
    return counts[:, :vocab]
