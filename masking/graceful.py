"""Graceful closure: pace a tight budget's spare tokens over the whole output.

The budget-aware mask allows every token from which the output can still finish in the
tokens left, and nothing more. A model that spends its spare tokens early (a blank, a long
first string) is then forced into the shortest closure for everything after it, and the
last fields come out empty: valid, but hollow. This policy reweights the masked logits of a
budget-aware row so that the spare tokens go into content, spread over the output. It only
adds finite amounts to logits, so a masked token (-inf) stays masked and an allowed one
stays allowed: validity and the budget guarantee are the mask's, unchanged.

The policy reads two things off the table, once per table (`TablePlan`). A *slot* is a state
with a free choice: its tokens begin with at least two different bytes other than blanks
(string content or its closing quote, an optional property or `}`, an array item or `]`),
except a number's states (the digits of a number are not content a reader misses). And
`ahead[s]` is a lookahead over the table's distances: the slots on the shortest way from
`s` to the end, counting an empty literal (`""`, `[]`, `{}` in one token) on the way as
the slot it skips.

With `r` tokens left, a token leading to state `n` leaves the slack `r - 1 - dist[n]`. In
a slot with `k = ahead[s]` slots after it and `avail = r - 1 - dist[s]` spare tokens if
it writes one more token of content, the slots after it keep an even share of them,

    share = reserve * avail * k / (k + 1)

and the rest, `unspent = avail - share` (at most `close_cap`), is this slot's to spend.
Over the whole output, with `S0 = B - d0` spare tokens (budget `B`, shortest output
`d0`) and `K` slots (at least `k + 1`), the slots after this one may claim

    target = reserve * S0 * k / K
Around these:

- in a slot, a lateral token (one that keeps the distance: string content) that leaves
  less than `target` is lowered by `lateral_penalty` per token of shortfall: it would eat
  the share of the slots still ahead;
- in a slot where content could be written (a lateral token other than a blank, or a move
  away from acceptance that still fits: another array item, an optional property), a
  closing token (a closing quote, `]`, `}`, a comma) is lowered by `close_penalty` per
  unspent token: write content here before moving on. Every closing token of the state
  pays the same, so one that closes in fewer tokens is not the loser;
- an empty literal (`""`, `[]`, `{}` in one token: a slot written at its minimum) is
  lowered by `empty_penalty` per unspent token, where another token fits;
- outside slots (a key's spelling, a number's digits), a token that makes no progress
  (`product` then `s` where `products` is one token, a number's further digits) is lowered
  by `waste_penalty` per token it costs while a slot lies ahead: it spends a spare token on
  nothing a reader sees. A move into a slot is spared (`[` before an array's items) unless
  the way forward it competes with writes the slot at its minimum anyway;
- a token made only of whitespace is lowered by `blank_penalty`: a blank is a spare token
  spent on nothing.

Tokens that move away from acceptance inside a slot (opening an optional property, another
array item) are the model's choice of content and are left alone. Every rule above applies
only where the budget bites: where the token would leave fewer than `horizon` spare tokens,
in a request with fewer than `generous` spare tokens in all (`B - d0`). A request with
more is left to the plain mask entirely (a long answer that runs into its budget is cut
short by the mask alone).

Past the horizon, in such a request, one rule still acts: a slot written at its minimum
while its spare tokens are unspent, an empty literal or a closer right after its opener
(`[` then `]`, `{` then `}`: the *opened* states, which may close or take a first item or
key), is lowered by `empty_penalty` per unspent token, as above, and a blank in an opened
state by `blank_penalty` (it puts the choice off). Without it a model that
answers `[]` at once (a top-level list with 14 spare tokens) does so at any budget below
`generous`: the mask-only output at a budget that does not bite is hollow by the model's
choice, and the request's spare tokens are still there to fill it. Otherwise outputs that
end well within their budget are exactly those of the plain mask.
"""

from __future__ import annotations

import math
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from gclm.compiler import CompiledTable
from gclm.masking.graceful_plan import BLANK, TablePlan, Where, on
from gclm.masking.state import ConstraintState

if TYPE_CHECKING:
    from gclm.masking.source import MaskSource

# Policy names a request may ask for (structured_outputs.budget_policy); the first is the default.
POLICY_NAMES = ("graceful", "none")

# An empty string, array or object in one token ("" not closing an escaped quote): a slot
# written at its minimum.
_EMPTY_LITERAL = re.compile(rb'(?<!\\)""|\[\s*\]|\{\s*\}')


class Penalties(NamedTuple):
    """What the policy lowers in one row."""

    sets: list[int]  # indices into the table's token_sets of successor groups to lower
    pens: list[float]  # their penalties, each > 0
    blanks: bool  # whether whitespace-only tokens are lowered by blank_penalty
    empty: float  # what empty-literal tokens are lowered by (0: nothing)


@dataclass(frozen=True)
class GracefulPolicy:
    """The default BudgetPolicy (see the module docstring). Build it with `for_vocab`."""

    blank_ids: tuple[int, ...] = ()  # tokens made only of whitespace
    empty_ids: tuple[int, ...] = ()  # tokens that write an empty literal: "", [], {}
    horizon: float = 8.0
    generous: float = 32.0  # a request with this many spare tokens or more is left alone
    reserve: float = 0.8
    lateral_penalty: float = 1.5
    close_penalty: float = 2.0
    close_cap: float = 3.0
    blank_penalty: float = 4.0
    waste_penalty: float = 4.0
    empty_penalty: float = 2.0
    # Each token id's first byte (-1: none, a special token): what tells a slot (a free
    # choice of bytes) from a fixed spelling. Empty: unknown, every state with content is a
    # slot.
    first_bytes: tuple[int, ...] = field(default=(), repr=False, compare=False)
    _listed: dict[tuple[str, Where], np.ndarray | torch.Tensor] = field(
        default_factory=dict, repr=False, compare=False
    )
    _plans: weakref.WeakKeyDictionary[CompiledTable, TablePlan] = field(
        default_factory=weakref.WeakKeyDictionary, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not 0.0 <= self.reserve <= 1.0:
            raise ValueError(f"reserve must be between 0 and 1, got {self.reserve}.")
        for name in self.settings():
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}.")

    @classmethod
    def settings(cls) -> tuple[str, ...]:
        """The policy's numeric knobs (every float field; bench/budget/ tunes them)."""
        return tuple(f.name for f in fields(cls) if f.type == "float")

    @classmethod
    def for_vocab(cls, token_bytes: Sequence[bytes | None], **settings: Any) -> GracefulPolicy:
        """The policy for a vocabulary given as each token id's bytes (None: special)."""
        blank = tuple(i for i, b in enumerate(token_bytes) if b and set(b) <= BLANK)
        empty = tuple(i for i, b in enumerate(token_bytes) if b and _EMPTY_LITERAL.search(b))
        first = tuple(b[0] if b else -1 for b in token_bytes)
        return cls(blank_ids=blank, empty_ids=empty, first_bytes=first, **settings)

    def penalties(
        self, table: CompiledTable, state: int, tokens_left: int, budget: int
    ) -> Penalties:
        """What to lower in one row (see Penalties).

        Args:
            table: the row's compiled table; `state` its DFA state.
            tokens_left: tokens left, counting the one about to be sampled.
            budget: the request's max_tokens (the spare tokens are spread over all of it).
        """
        plan = self._plan(table)
        d0 = plan.min_tokens
        spare = budget - d0
        r1 = tokens_left - 1
        here = plan.dist[state]
        # Every successor leaves at least r1 - maxsucc spare tokens: past the horizon, the
        # budget does not bite and there is nothing to do (most steps of a generous budget).
        if d0 <= 0 or not 0 < spare < self.generous:
            return Penalties([], [], False, 0.0)
        if r1 - max(plan.maxsucc[state], here) >= self.horizon:
            return self._far(plan, state, r1)
        blanks = self.blank_penalty > 0 and r1 - here < self.horizon
        lo, hi = plan.offsets[state], plan.offsets[state + 1]
        groups = [
            (plan.dist[n], n, index)
            for n, index in zip(plan.group_next[lo:hi], plan.group_set[lo:hi], strict=True)
        ]
        avail = max(r1 - here, 0)
        ahead = plan.ahead[state]
        unspent = self._unspent(avail, ahead)
        # An empty literal ("", [], {}) writes a slot at its minimum: lowered like closing,
        # where another token fits.
        other = any(here <= d <= r1 for d, _, _ in groups)
        empty = self._empty(plan, state, avail) if other else 0.0
        sets: list[int] = []
        pens: list[float] = []
        if not plan.slot[state]:
            # A fixed spelling (a key, a number's digits): a token that makes no progress
            # here spends a spare token on nothing a reader sees, while a slot lies ahead.
            # A move into a slot is spared only where every way forward writes it empty.
            into = all(plan.skips[index] for d, _, index in groups if d < here)
            for d, nxt, index in groups:
                slack = r1 - d
                if not (0 <= slack < self.horizon and d >= here) or (into and plan.slot[nxt]):
                    continue
                if plan.ahead[nxt] + plan.slot[nxt] > 0 and self.waste_penalty > 0:
                    sets.append(index)
                    pens.append(self.waste_penalty * (d - here + 1))
            return Penalties(sets, pens, blanks, empty)
        # Closing is lowered by what staying would leave unspent beyond the others' share,
        # the same for every closing token (so a token that closes in fewer tokens is not
        # the one that pays), and only where content could be written instead: a lateral
        # token other than a blank (string content), or a move away that still fits (an
        # array item, an optional property).
        content = any((d == here and plan.solid(index)) or here < d <= r1 for d, _, index in groups)
        close = self.close_penalty * unspent if content else 0.0
        # Content here may take the spare tokens down to the later slots' share of the
        # whole budget's spare tokens, no further.
        target = self.reserve * spare * ahead / max(plan.slots, ahead + 1)
        for d, _, index in groups:
            slack = r1 - d
            if slack < 0 or slack >= self.horizon or d > here:
                continue  # masked, not biting, or moving away from acceptance: left alone
            pen = self.lateral_penalty * (target - slack) if d == here else close
            if pen > 0:
                sets.append(index)
                pens.append(pen)
        return Penalties(sets, pens, blanks, empty)

    def _far(self, plan: TablePlan, state: int, r1: int) -> Penalties:
        """Past the horizon, only what writes a slot at its minimum while the request still
        has the spare tokens to fill it: an empty literal ("", [], {} in one token), and a
        closer right after its opener (`[` then `]`: the array left empty)."""
        pen = self._empty(plan, state, max(r1 - plan.dist[state], 0))
        if not pen:
            return Penalties([], [], False, 0.0)
        empty = pen if plan.has_empty(state) else 0.0
        if not plan.opened[state]:
            return Penalties([], [], False, empty)
        # A blank here puts off the choice between closing it empty and its first item.
        lo, hi = plan.offsets[state], plan.offsets[state + 1]
        here = plan.dist[state]
        closing = [
            index
            for n, index in zip(plan.group_next[lo:hi], plan.group_set[lo:hi], strict=True)
            if plan.dist[n] < here
        ]
        return Penalties(closing, [pen] * len(closing), self.blank_penalty > 0, empty)

    def _unspent(self, avail: int, ahead: int) -> float:
        """What a slot with `avail` spare tokens and `ahead` slots after it on the shortest
        way to the end may spend itself: beyond the even share the slots after it keep, at
        most close_cap."""
        share = self.reserve * avail * ahead / (ahead + 1)
        return min(avail - share, self.close_cap)

    def _empty(self, plan: TablePlan, state: int, avail: int) -> float:
        """What empty-literal tokens are lowered by in `state` (0: nothing)."""
        unspent = self._unspent(avail, plan.ahead[state])
        return self.empty_penalty * unspent if unspent > 0 else 0.0

    def serves_lazily(self, source: MaskSource, budget: int) -> bool:
        """Whether the request is generous, so that no rule acts and no whole table is
        needed: every rule acts only in a request with fewer than `generous` spare tokens
        (budget - d0, see penalties), and an upper bound on the start state's distance
        proves most requests generous without the exact d0."""
        if budget - source.upper_bound(source.initial) >= self.generous:
            return True
        d0 = source.request_minimum()
        return d0 <= 0 or budget - d0 >= self.generous

    def adjust(
        self, logits: torch.Tensor, state: ConstraintState, tokens_left: int, budget: int
    ) -> None:
        """masking.policy.BudgetPolicy: lower, in place, one row's logits [V_logits].

        Cost: nothing past the horizon; else at most one pass over the row plus the token
        lists of the state's smaller groups.
        """
        if state.thinking:  # free text before the constraint: nothing to pace yet
            return
        table = state.table
        if table is None:
            if self.serves_lazily(state.masks, budget):
                return
            raise TypeError(
                f"Graceful closure of a tight budget ({budget - state.masks.request_minimum()} "
                f"spare tokens, under {self.generous:g}) plans over a whole compiled table; "
                "this sequence masks with a lazy source. Compile the constraint with "
                "compile_constraint."
            )
        sets, pens, blanks, empty = self.penalties(table, state.state, tokens_left, budget)
        if not sets and not blanks and not empty:
            return
        # On the CPU, numpy indexing of the same memory costs a fraction of torch's.
        cpu = logits.device.type == "cpu" and logits.dtype != torch.bfloat16
        row = logits.numpy() if cpu else logits
        where: Where = "numpy" if cpu else logits.device
        if blanks and self.blank_ids:
            row[self._ids("blank_ids", where)] -= self.blank_penalty
        if empty and self.empty_ids:
            row[self._ids("empty_ids", where)] -= empty
        if not sets:
            return
        plan = self._plan(table)
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

    def _plan(self, table: CompiledTable) -> TablePlan:
        plan = self._plans.get(table)
        if plan is None:
            plan = self._plans[table] = TablePlan(
                table, self.first_bytes, len(self.blank_ids), self.empty_ids
            )
        return plan

    def _ids(self, name: str, where: Where) -> np.ndarray | torch.Tensor:
        """The token ids of the field `name` (blank_ids, empty_ids) for a row `where`."""
        out = self._listed.get((name, where))
        if out is None:
            ids = np.asarray(getattr(self, name), dtype=np.int64)
            out = self._listed[name, where] = on(ids, where)
        return out
