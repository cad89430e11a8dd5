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

from gclm.server.engine.protocol import GenerationRequest


class _Row(Protocol):
    request: GenerationRequest

    @property
    def output_ids(self) -> list[int]: ...


def apply_penalties(logits: torch.Tensor, rows: Seq[_Row]) -> None:
    """Penalise and bias `logits` [B, V] in place; row i belongs to rows[i].

    Only the rows that ask for a penalty or a bias are touched.
    """
    picked = [i for i, r in enumerate(rows) if r.request.params.penalized]
    if not picked:
        return
    device, vocab = logits.device, logits.shape[1]
    params = [rows[i].request.params for i in picked]
    every = len(picked) == len(rows)
    sub = logits if every else logits[picked]  # [P, V]; a copy unless every row is picked

    biases = [(j, t, b) for j, p in enumerate(params) for t, b in p.logit_bias]
    if biases:
        at, tokens, values = (torch.tensor(v, device=device) for v in zip(*biases, strict=True))
        sub.index_put_((at, tokens), values.to(sub.dtype), accumulate=True)

    # Both penalties gather the logits of the tokens seen, change them and scatter them back:
    # O(tokens seen) per row, as transformers' RepetitionPenaltyLogitsProcessor, rather than
    # O(V). Rows are padded with their own first token: a duplicate writes the same value.
    rep = [p.repetition_penalty for p in params]
    if any(r != 1.0 for r in rep):
        seen = _padded([rows[i].request.prompt_ids + rows[i].output_ids for i in picked])
        seen = seen.to(device)  # [P, L]
        scores = sub.gather(1, seen)  # [P, L]
        factor = torch.tensor(rep, dtype=sub.dtype, device=device)[:, None]  # [P, 1]
        sub.scatter_(1, seen, torch.where(scores > 0, scores / factor, scores * factor))

    freq = torch.tensor([p.frequency_penalty for p in params], device=device)[:, None]
    presence = torch.tensor([p.presence_penalty for p in params], device=device)[:, None]
    if bool(freq.any() or presence.any()):
        outputs = [rows[i].output_ids or [0] for i in picked]  # [0]: counted 0 times below
        out = _padded(outputs).to(device)  # [P, L]
        count = _counts([rows[i].output_ids for i in picked], vocab, device).gather(1, out)
        penalty = torch.where(count > 0, freq * count + presence, 0.0)  # [P, L]
        sub.scatter_(1, out, sub.gather(1, out) - penalty)
    if not every:
        logits[picked] = sub


def _padded(token_lists: list[list[int]]) -> torch.Tensor:
    """long [len(token_lists), longest]: each list padded with its own first token."""
    width = max(len(t) for t in token_lists)
    return torch.tensor([t + [t[0]] * (width - len(t)) for t in token_lists], dtype=torch.long)


def _counts(token_lists: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """[len(token_lists), vocab] float: how often each token occurs in each list."""
    width = max((len(t) for t in token_lists), default=0)
    # Padding goes to a spill column past the vocabulary, dropped at the end.
    ids = torch.tensor([t + [vocab] * (width - len(t)) for t in token_lists], dtype=torch.long)
    ids = ids.reshape(len(token_lists), width).to(device)
    counts = torch.zeros(len(token_lists), vocab + 1, device=device)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=counts.dtype))
    return counts[:, :vocab]
