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
- where content could be written (a lateral token other than a blank, or a move away from
  acceptance that still fits: another array item, an optional property), a closing token
  (one that brings acceptance closer: a closing quote, a comma, a brace) is lowered by
  `close_penalty` per spare token that staying would leave unspent beyond the target (at
  most `close_cap` tokens): write content here before moving on. Every closing token of
  the state pays the same, so one that closes in fewer tokens is not the loser;
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
# Where a row's token ids are used: "numpy" (indexing the numpy view of a CPU row), or the
# device of a tensor row.
Where = str | torch.device


@dataclass(frozen=True)
class GracefulPolicy:
    """The default BudgetPolicy (see the module docstring). Build it with `for_vocab`."""

    blank_ids: tuple[int, ...] = ()  # tokens made only of whitespace
    horizon: float = 8.0
    reserve: float = 0.8
    lateral_penalty: float = 1.5
    close_penalty: float = 2.0
    close_cap: float = 3.0
    blank_penalty: float = 4.0
    _blank: dict[Where, np.ndarray | torch.Tensor] = field(
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
    ) -> tuple[list[int], list[float], bool]:
        """(set indices, penalties > 0, whether blanks are penalised) for one row.

        Args:
            table: the row's compiled table; `state` its DFA state.
            tokens_left: tokens left, counting the one about to be sampled.
            budget: the request's max_tokens (the spare tokens are spread over all of it).
        Returns:
            indices into `table.token_sets` of the successor groups to lower, their
            penalties, and whether whitespace-only tokens are lowered.
        """
        plan = _plan(table)
        d0 = plan.min_tokens
        spare = budget - d0
        r1 = tokens_left - 1
        here = plan.dist[state]
        # Every successor leaves at least r1 - maxsucc spare tokens: past the horizon, the
        # budget does not bite and there is nothing to do (most steps of a generous budget).
        if d0 <= 0 or spare <= 0 or r1 - max(plan.maxsucc[state], here) >= self.horizon:
            return [], [], False
        blanks = self.blank_penalty > 0 and r1 - here < self.horizon
        by_time = r1 / budget
        lo, hi = plan.offsets[state], plan.offsets[state + 1]
        groups = list(zip(plan.group_next[lo:hi], plan.group_set[lo:hi], strict=True))
        # Closing is lowered by what staying would leave unspent beyond the schedule, the
        # same for every closing token (so a token that closes in fewer tokens is not the
        # one that pays), and only where content could be written instead: a lateral token
        # other than a blank (string content, digits), or a move away that still fits (an
        # array item, an optional property).
        unspent = r1 - here - self.reserve * spare * min(here / d0, by_time)
        content = any(
            (d == here and plan.size[index] > len(self.blank_ids)) or here < d <= r1
            for d, index in ((plan.dist[nxt], index) for nxt, index in groups)
        )
        close = self.close_penalty * min(unspent, self.close_cap) if content else 0.0
        sets: list[int] = []
        pens: list[float] = []
        for nxt, index in groups:
            d = plan.dist[nxt]
            slack = r1 - d
            if slack < 0 or slack >= self.horizon or d > here:
                continue  # masked, not biting, or moving away from acceptance: left alone
            if d == here:
                target = self.reserve * spare * min(d / d0, by_time)
                pen = self.lateral_penalty * (target - slack)
            else:
                pen = close
            if pen > 0:
                sets.append(index)
                pens.append(pen)
        return sets, pens, blanks

    def adjust(
        self, logits: torch.Tensor, state: ConstraintState, tokens_left: int, budget: int
    ) -> None:
        """masking.policy.BudgetPolicy: lower, in place, one row's logits [V_logits].

        Cost: nothing past the horizon; else at most one pass over the row plus the token
        lists of the state's smaller groups.
        """
        table = state.table
        sets, pens, blanks = self.penalties(table, state.state, tokens_left, budget)
        if not sets and not blanks:
            return
        # On the CPU, numpy indexing of the same memory costs a fraction of torch's.
        cpu = logits.device.type == "cpu" and logits.dtype != torch.bfloat16
        row = logits.numpy() if cpu else logits
        where: Where = "numpy" if cpu else logits.device
        if blanks and self.blank_ids:
            row[self._ids(self.blank_ids, where)] -= self.blank_penalty
        if not sets:
            return
        plan = _plan(table)
        given = dict(zip(sets, pens, strict=True))
        lo, hi = plan.offsets[state.state], plan.offsets[state.state + 1]
        own = plan.group_set[lo:hi]
        # The largest group is often nearly the whole vocabulary (string content). If it is
        # lowered, lower the whole row instead and give the other tokens back the
        # difference: one pass over the row, and token lists of the smaller groups only.
        # Masked tokens stay -inf either way.
        base = max(own, key=plan.size.__getitem__)
        base_pen = given.get(base, 0.0)
        if base_pen:
            row -= base_pen
            row[table.eos_token_id] += base_pen
        for index in own:
            delta = given.get(index, 0.0) - base_pen
            if index != base and delta:
                row[plan.tokens(index, where)] -= delta

    def _ids(self, ids: tuple[int, ...], where: Where) -> np.ndarray | torch.Tensor:
        out = self._blank.get(where)
        if out is None:
            out = self._blank[where] = _on(np.asarray(ids, dtype=np.int64), where)
        return out


def _on(ids: np.ndarray, where: Where) -> np.ndarray | torch.Tensor:
    return ids if where == "numpy" else torch.from_numpy(ids).to(where)


# Sets of at most this many tokens keep their id tensor in the plan (they are most sets).
_LISTED = 4096


class _Plan:
    """A table's arrays as Python lists, for per-step scalar access (built once per table)."""

    def __init__(self, table: CompiledTable) -> None:
        self.token_sets = table.token_sets
        self.min_tokens = table.min_tokens
        self.dist = table.dist.tolist()
        self.maxsucc = table.max_next_dist.tolist()
        self.offsets = table.group_offsets.tolist()
        self.group_next = table.group_next.tolist()
        self.group_set = table.group_set.tolist()
        self.size = table.token_sets.counts().tolist()
        self._ids: dict[tuple[int, Where], np.ndarray | torch.Tensor] = {}

    def tokens(self, index: int, where: Where) -> np.ndarray | torch.Tensor:
        """int64 token ids of set `index`, for a row `where` (cached for small sets)."""
        ids = self._ids.get((index, where))
        if ids is None:
            ids = _on(self.token_sets.tokens_of(index).astype(np.int64), where)
            if self.size[index] <= _LISTED:
                self._ids[index, where] = ids
        return ids


_PLANS: weakref.WeakKeyDictionary[CompiledTable, _Plan] = weakref.WeakKeyDictionary()


def _plan(table: CompiledTable) -> _Plan:
    plan = _PLANS.get(table)
    if plan is None:
        plan = _PLANS[table] = _Plan(table)
    return plan
