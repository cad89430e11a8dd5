"""The seam for logit adjustments inside the budget-aware mask.

A `BudgetPolicy` reweights the logits of one constrained row after the mask is applied. It
may only add finite amounts to finite logits: a masked token (-inf) stays masked and an
allowed one stays allowed, so validity and the budget guarantee remain the mask's.
`masking/graceful.py`'s `GracefulPolicy` is one.
"""

from __future__ import annotations

from typing import Protocol

import torch

from gclm.masking.source import MaskSource
from gclm.masking.state import ConstraintState


class BudgetPolicy(Protocol):
    def adjust(
        self, logits: torch.Tensor, state: ConstraintState, tokens_left: int, budget: int
    ) -> None:
        """Reweight, in place, one row's masked logits [V_logits].

        Args:
            logits: the row's logits, the mask already applied.
            state: the row's constraint state (its table and DFA state).
            tokens_left: tokens left, counting the one about to be sampled.
            budget: the request's whole budget (max_tokens).
        """
        ...

    def serves_lazily(self, source: MaskSource, budget: int) -> bool:
        """Whether it can adjust the rows of a request of `budget` tokens that masks with
        `source` alone, without a whole table to plan over (a lazy source): else the request
        waits for the whole table (compiler/service/first_mask.py)."""
        ...
