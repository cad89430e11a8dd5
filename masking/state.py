"""Per-sequence DFA state: the request-level half of masking."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from gclm.compiler import CompiledTable
from gclm.errors import BudgetTooSmallError, InternalError
from gclm.masking.masks import mask_source, whole_table
from gclm.masking.source import MaskSource


class Prelude(Protocol):
    """What comes before the constraint (masking/reasoning.py's ThinkingSpec: thinking)."""

    def min_tokens(self, table: CompiledTable) -> int:
        """The fewest tokens the prelude plus the constraint take."""
        ...


def check_budget(
    table: CompiledTable | MaskSource,
    budget: int,
    param: str = "max_tokens",
    thinking: Prelude | None = None,
) -> None:
    """Refuse a request up front when `budget` tokens cannot complete the constraint (after
    closing its thinking, for a request that thinks first: masking/reasoning.py).

    A lazy source answers from its bounds when the budget is at least the start state's
    upper bound, and finds the exact minimum only when it is below, so that the error names
    it.

    Raises:
        BudgetTooSmallError: `budget` is below the minimum; the message names `param`.
        ValueError: a thinking prelude without a whole table to plan it over.
    """
    whole = whole_table(table)
    if whole is not None:
        need = whole.min_tokens if thinking is None else thinking.min_tokens(whole)
        if budget < need:
            raise BudgetTooSmallError(need, budget, param=param)
        return
    if thinking is not None:
        raise ValueError("A thinking prelude needs the whole table (compile_constraint).")
    source = mask_source(table)
    if not source.request_fits(budget):
        raise BudgetTooSmallError(source.request_minimum(), budget, param=param)


class ConstraintState:
    """Where one sequence stands in its constraint's DFA.

    Budget semantics: with `r` tokens left (counting the one being sampled), token `v` is
    allowed from state `s` iff `delta(s, v)` exists and `dist[delta(s, v)] <= r - 1`; EOS is
    allowed iff `s` is accepting and does not spend budget. A sequence that is not
    `budget_aware` only requires that `delta(s, v)` exists.
    """

    __slots__ = ("table", "masks", "budget_aware", "state", "finished", "num_tokens")

    def __init__(self, table: CompiledTable | MaskSource, budget_aware: bool = True) -> None:
        # The whole table where the sequence has one (a policy plans over it), and what
        # its rows are masked with, whole or lazy.
        self.table: CompiledTable | None = whole_table(table)
        self.masks: MaskSource = mask_source(table)
        self.budget_aware = budget_aware
        self.state = self.masks.initial
        self.finished = False  # EOS consumed
        self.num_tokens = 0  # non-EOS tokens consumed

    def __repr__(self) -> str:
        return (
            f"ConstraintState(state={self.state}, accepting={self.is_accepting}, "
            f"finished={self.finished}, num_tokens={self.num_tokens})"
        )

    @property
    def thinking(self) -> bool:
        """Whether the sequence is in a reasoning phase before its constraint (always False
        here; masking/reasoning.py's ReasoningState has one)."""
        return False

    @property
    def is_accepting(self) -> bool:
        """Whether the text so far is a complete output of the constraint."""
        return self.masks.is_accepting(self.state)

    @property
    def dist(self) -> int:
        """Fewest further tokens that reach acceptance (0 when accepting)."""
        return self.masks.dist(self.state)

    def must_stop(self, tokens_left: int) -> bool:
        """True when the sequence has to end now: EOS consumed, or accepting with no budget
        left or no token that could continue it."""
        if self.finished:
            return True
        if not self.is_accepting:
            return False
        return tokens_left <= 0 or not self.masks.has_tokens(self.state)

    def allowed_row(self, tokens_left: int | None) -> np.ndarray:
        """int32 [W]: the tokens this sequence may sample next, with `tokens_left` left
        (counting this one; ignored, may be None, when it is not budget-aware).

        Raises:
            InternalError: no token is allowed (the budget was not checked).
            ValueError: a budget-aware sequence without tokens_left.
        """
        if not self.budget_aware:
            return self.masks.forward_row(self.state)
        if tokens_left is None:
            raise ValueError("A budget-aware sequence needs tokens_left.")
        return self.masks.row(self.state, tokens_left)

    def advance(self, token_id: int, tokens_left: int | None = None) -> None:
        """Consume one sampled token: one gather over the state's successor groups.

        Args:
            token_id: the token sampled for this sequence.
            tokens_left: when given (budget-aware sequences), the budget before this token;
                the token must leave enough of it to reach acceptance.
        Raises:
            InternalError: the token is not allowed here (the mask and the sampler disagree),
                or the sequence already finished.
        """
        if self.finished:
            raise InternalError(f"Token {token_id} sampled after EOS; the sequence had ended.")
        if token_id == self.masks.eos_token_id:
            if not self.is_accepting:
                raise InternalError(
                    f"EOS sampled in non-accepting state {self.state}: the mask allowed it."
                )
            self.finished = True
            return
        nxt = self.masks.next_state(self.state, token_id)
        if nxt < 0:
            raise InternalError(
                f"Token {token_id} is not allowed in state {self.state}: it was sampled "
                "outside the mask."
            )
        if self.budget_aware and tokens_left is not None:
            if not self.masks.fits(nxt, tokens_left - 1):
                raise InternalError(
                    f"Token {token_id} leads to state {nxt}, which needs "
                    f"{self.masks.dist(nxt)} more tokens, but only {tokens_left - 1} are left."
                )
        self.state = nxt
        self.num_tokens += 1
