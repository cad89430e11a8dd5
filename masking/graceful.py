"""Graceful closure: pace a tight budget's spare tokens over the whole output.

The budget-aware mask allows every token from which the output can still finish in the
tokens left, and nothing more. A model that spends its spare tokens early (a blank, a long
first string) is then forced into the shortest closure for everything after it, and the
last fields come out empty: valid, but hollow. This policy reweights the masked logits of a
budget-aware row so that the spare tokens go into content, spread over the output. It only
adds finite amounts to logits, so a masked token (-inf) stays masked and an allowed one
stays allowed: validity and the budget guarantee are the mask's, unchanged.

With budget `B`, `d0` the shortest output's length and `S0 = B - d0` spare tokens, a token
leading to state `n` with `r` tokens left leaves the slack `r - 1 - dist[n]`. The schedule
keeps, for what is still ahead, the target slack

    reserve * S0 * min(dist[n] / d0, (r - 1) / B)

(the smaller of an even spread by structure, the share of the shortest output still to
write, and by time, the share of the budget still to spend). Around it:

- a lateral token (one that keeps the distance: string content, digits) that leaves less
  than the target is lowered by `lateral_penalty` per token of shortfall: it would eat the
  share of the fields still ahead;
- a closing token (one that brings acceptance closer: a closing quote, a comma, a brace)
  that leaves more than the target is lowered by `close_penalty` per spare token it would
  leave unspent (at most `close_cap` tokens): write content here before moving on;
- a token made only of whitespace is lowered by `blank_penalty`: a blank is a spare token
  spent on nothing.

Tokens that move away from acceptance (opening an optional property, another array item)
are the model's choice of content and are left alone. Every rule applies only where the
budget bites: where the token would leave fewer than `horizon` spare tokens. With a
generous budget the policy stays silent until the last `horizon` spare tokens, so outputs
that end well within their budget are exactly those of the plain mask.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from gclm.compiler.tables import CompiledTable
from gclm.masking.state import ConstraintState

# Policy names a request may ask for (structured_outputs.budget_policy); the first is the default.
POLICY_NAMES = ("graceful", "none")

_BLANK = frozenset(b" \t\n\r")


@dataclass(frozen=True)
class GracefulPolicy:
    """The default BudgetPolicy (see the module docstring). Build it with `for_vocab`."""

    blank_ids: tuple[int, ...] = ()  # tokens made only of whitespace
    horizon: float = 8.0
    reserve: float = 0.8
    lateral_penalty: float = 1.5
    close_penalty: float = 1.0
    close_cap: float = 3.0
    blank_penalty: float = 4.0
    _blank: dict[torch.device, torch.Tensor] = field(
        default_factory=dict, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not 0.0 <= self.reserve <= 1.0:
            raise ValueError(f"reserve must be between 0 and 1, got {self.reserve}.")
        for name in (
            "horizon",
            "lateral_penalty",
            "close_penalty",
            "close_cap",
            "blank_penalty",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}.")

    @classmethod
    def for_vocab(cls, token_bytes: Sequence[bytes | None], **settings: float) -> GracefulPolicy:
        """The policy for a vocabulary given as each token id's bytes (None: special)."""
        blank = tuple(i for i, b in enumerate(token_bytes) if b and set(b) <= _BLANK)
        return cls(blank_ids=blank, **settings)

    def penalties(
        self, table: CompiledTable, state: int, tokens_left: int, budget: int
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """(set indices, penalties > 0, whether blanks are penalised) for one row.

        Args:
            table: the row's compiled table; `state` its DFA state.
            tokens_left: tokens left, counting the one about to be sampled.
            budget: the request's max_tokens (the spare tokens are spread over all of it).
        Returns:
            int32 [K] indices into `table.token_sets` of the successor groups to lower,
            float64 [K] their penalties, and whether whitespace-only tokens are lowered.
        """
        none = np.zeros(0, np.int32), np.zeros(0, np.float64), False
        d0 = table.min_tokens
        spare = budget - d0
        if d0 <= 0 or spare <= 0:
            return none
        here = int(table.dist[state])
        blanks = self.blank_penalty > 0 and tokens_left - 1 - here < self.horizon
        nexts, sets = table.groups(state)
        dist_next = table.dist[nexts].astype(np.float64)  # [G_s]
        slack = tokens_left - 1 - dist_next  # [G_s]; < 0: masked
        target = self.reserve * spare * np.minimum(dist_next / d0, (tokens_left - 1) / budget)
        lateral = dist_next == here
        closing = dist_next < here
        pen = np.zeros_like(slack)
        pen[lateral] = self.lateral_penalty * (target - slack)[lateral]
        unspent = np.minimum(slack - target, self.close_cap)
        pen[closing] = self.close_penalty * unspent[closing]
        hit = (pen > 0) & (slack >= 0) & (slack < self.horizon)
        return sets[hit].astype(np.int32), pen[hit], blanks

    def adjust(
        self, logits: torch.Tensor, state: ConstraintState, tokens_left: int, budget: int
    ) -> None:
        """masking.policy.BudgetPolicy: lower, in place, one row's logits [V_logits].

        Cost: at most one pass over the row plus the token lists of the smaller groups.
        """
        table = state.table
        sets, pens, blanks = self.penalties(table, state.state, tokens_left, budget)
        if blanks and self.blank_ids:
            logits[self._blank_ids(logits.device)] -= self.blank_penalty
        if not sets.size:
            return
        # One group is often nearly the whole vocabulary (string content): lower the whole
        # row by its penalty, then give the other allowed tokens back what they should not
        # lose. Masked tokens stay -inf either way.
        counts = _set_sizes(table)
        _, own = table.groups(state.state)
        base = int(sets[np.argmax(counts[sets])])
        base_pen = float(pens[sets == base][0])
        logits -= base_pen
        given = dict(zip(sets.tolist(), pens.tolist(), strict=True))
        for s in own.tolist():
            back = base_pen - given.get(s, 0.0)
            if s != base and back:
                ids = table.token_sets.tokens_of(s)
                logits[torch.from_numpy(ids.astype(np.int64)).to(logits.device)] += back
        logits[table.eos_token_id] += base_pen

    def _blank_ids(self, device: torch.device) -> torch.Tensor:
        ids = self._blank.get(device)
        if ids is None:
            ids = self._blank[device] = torch.tensor(self.blank_ids, device=device)
        return ids


_SIZES: weakref.WeakKeyDictionary[CompiledTable, np.ndarray] = weakref.WeakKeyDictionary()


def _set_sizes(table: CompiledTable) -> np.ndarray:
    """int64 [M]: tokens in each of the table's sets (computed once per table)."""
    sizes = _SIZES.get(table)
    if sizes is None:
        sizes = _SIZES[table] = table.token_sets.counts()
    return sizes
