"""One mask-apply step for a batch of rows: the only place any engine masks its logits.

    rows = [MaskRow(state, tokens_left, budget, policy), MaskRow.free(), ...]  # one per row
    mask_rows(logits, bitmask, rows, vocab_size)                               # in place

Each row's allowed tokens are written into the preallocated bitmask (every token for an
unconstrained row), the whole batch is masked in one pass, then each budget-aware row's
BudgetPolicy reweights what the mask left. The transformers engine, the `generate()`
adapter (masking/hf.py) and the vLLM processor (masking/vllm.py) all call this, so the
budget policy and the order "mask, then policy" are the same on every engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from gclm.errors import CompileLimitError
from gclm.masking.bitmask import apply_bitmask, fill_bitmask, fill_unconstrained
from gclm.masking.policy import BudgetPolicy
from gclm.masking.state import ConstraintState


class MaskRow(NamedTuple):
    """What masking one row of the batch needs."""

    state: ConstraintState | None  # None: the row is not constrained (every token allowed)
    tokens_left: int | None = None  # counting the token being sampled; None if not budget-aware
    budget: int = 0  # the request's whole budget (max_tokens), for the policy
    policy: BudgetPolicy | None = None  # reweights a budget-aware row after the mask

    @classmethod
    def free(cls) -> MaskRow:
        """A row without a constraint."""
        return _FREE


_FREE = MaskRow(None)


def mask_rows(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    rows: Sequence[MaskRow],
    vocab_size: int,
    failed: dict[int, CompileLimitError] | None = None,
) -> None:
    """Mask `logits` [B, V_logits] in place: row i to what `rows[i]` allows, then its policy.

    Args:
        logits: one row per entry of `rows`.
        bitmask: int32 [>= B, W] buffer from `allocate_bitmask(..., vocab_size)`; its first B
            rows are overwritten.
        rows: one MaskRow per logits row.
        vocab_size: the tokenizer's vocabulary size (unconstrained rows allow every id below).
        failed: where given, a row whose mask source passes one of its limits while it
            grows the row (compiler/grown/pushdown.py's) is recorded here by its index,
            its logits left unmasked (the caller fails that row), instead of raising.
    Raises:
        InternalError: a row's state already consumed EOS, or allows no token.
        CompileLimitError: a row's mask source passed a limit, and `failed` is None.
    """
    count = len(rows)
    if logits.shape[0] != count:
        raise ValueError(f"mask_rows got {logits.shape[0]} logits rows for {count} MaskRows.")
    for i, row in enumerate(rows):
        if row.state is None:
            fill_unconstrained(bitmask, i, vocab_size)
            continue
        try:
            fill_bitmask(bitmask, i, row.state, row.tokens_left)
        except CompileLimitError as e:
            if failed is None:
                raise
            failed[i] = e
            fill_unconstrained(bitmask, i, vocab_size)
    apply_bitmask(logits, bitmask[:count])
    for i, row in enumerate(rows):
        state, policy = row.state, row.policy
        if failed and i in failed:
            continue
        if policy is not None and state is not None and state.budget_aware:
            assert row.tokens_left is not None  # a budget-aware row always has a budget
            policy.adjust(logits[i], state, row.tokens_left, row.budget)
