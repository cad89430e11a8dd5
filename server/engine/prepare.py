"""A request's constraint prepared in one place: first masks or the whole table, and the
budget checked once.

The HTTP layer hands the engine's constraint service what it parsed (the constraint, the
budget the request asks for, its thinking marker); `prepare` answers a PreparedConstraint
(server/engine/protocol.py) and the request's max_tokens:

- A request without a thinking phase starts on first masks where the table cache makes them
  (a LazyTable while the whole table compiles: compiler/service/first_mask.py, with
  `--first-mask lazy`). Its budget is checked against the lazy source's bounds, and its
  exact minimum searched where they do not decide, off the event loop and bounded
  (compiler/grown/lazy_table.py's REQUEST_SEARCH_STATES and the request's deadline).
- A thinking phase, a tight budget a policy paces, and a minimum past that bound wait for
  the whole table, within the same deadline.

A compile's seconds go to the first request that receives its table, or its first masks
(then when the compile ends), through that request's PrepareReport; requests that find the
table cached pay nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import weakref
from concurrent.futures import Future
from dataclasses import replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from gclm.compiler import CompiledTable, Constraint, SearchTooLarge, request_deadline
from gclm.errors import CompileLimitError, ConstraintError
from gclm.masking import MaskSource, check_budget, mask_source
from gclm.masking.policy import BudgetPolicy
from gclm.masking.reasoning import ThinkingSpec
from gclm.server.engine.protocol import BudgetAsk, PreparedConstraint, PrepareReport

if TYPE_CHECKING:
    from gclm.compiler import LazyTable


class CompileCharges:
    """Which compiled tables (or compile errors) were charged already: their compile seconds
    go to the first request that gets them."""

    def __init__(self) -> None:
        self._charged: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()

    def first_time(self, table: Any) -> bool:
        if self._charged.get(id(table)) is table:
            return False
        self._charged[id(table)] = table
        return True


class PreparesConstraints:
    """ConstraintService.prepare, over the `compile` and `budget_policy` of a subclass (the
    engine's Constraints, or a test's fake engine)."""

    async def compile(
        self, constraint: Constraint, *, first_mask: bool = False, deadline: float | None = None
    ) -> CompiledTable | LazyTable:
        """The constraint's table, or with `first_mask` its LazyTable while it compiles
        (where the cache makes them). Raises ConstraintError, and CompilerBusyError past
        `deadline`; never blocks the event loop."""
        raise NotImplementedError

    def budget_policy(self, name: str) -> BudgetPolicy | None:
        """The BudgetPolicy called `name` (masking.graceful.POLICY_NAMES); None for "none"."""
        raise NotImplementedError

    @property
    def grows_pushdown(self) -> bool:
        """Whether `compile` grows a grammar's pushdown masks in this process (a grammar
        whose rules recurse inside their alternatives is then served with no depth cap:
        compiler/grown/pushdown.py); else such a grammar is unrolled into a regex."""
        return False

    @cached_property
    def _charges(self) -> CompileCharges:
        return CompileCharges()

    async def prepare(
        self,
        constraint: Constraint,
        budget: BudgetAsk,
        *,
        budget_aware: bool = True,
        policy: str = "none",
        thinking: ThinkingSpec | None = None,
        deadline: float | None = None,
        report: PrepareReport | None = None,
    ) -> tuple[PreparedConstraint, int]:
        """The constraint ready to mask, and the request's max_tokens.

        Args:
            constraint: what the request constrains its output to.
            budget: the max_tokens it asks for (or a default's terms).
            budget_aware: False: a forward-only mask whose budget is not checked (a mode
                that shows what happens when the budget runs out).
            policy: the budget policy's name (masking.graceful.POLICY_NAMES).
            thinking: the end marker of a thinking phase before the output; its budget is
                planned over the whole table.
            deadline: time.monotonic() by which every table the request waits for is there.
            report: told the compile seconds it is charged and whether it starts on first
                masks.
        Raises:
            ConstraintError: the constraint does not compile.
            BudgetTooSmallError: `budget.requested` is below the minimum.
            CompilerBusyError: past `deadline`, while the compile goes on.
        """
        paced = self.budget_policy(policy) if budget_aware else None
        stack = thinking is None and self.grows_pushdown
        if stack and await _recurses(constraint):
            constraint = replace(constraint, pushdown=True)
        try:
            table = await self._compiled(constraint, thinking is None, deadline, report)
        except CompileLimitError:
            # A schema whose regex passes a limit: every $ref a call instead, or its large
            # subschemas frames of their own (compiler/grown/pushdown.py); where that fails
            # too, the same error again.
            if not (stack and _calls_may_fit(constraint)):
                raise
            constraint = replace(constraint, pushdown=True)
            table = await self._compiled(constraint, True, deadline, report)
        if not isinstance(table, CompiledTable) and table.final:  # no whole table behind it
            max_tokens = await asyncio.to_thread(
                self._lazy_budget, table, budget, budget_aware, None, deadline
            )
            assert max_tokens is not None  # a final source's searches are bounded, not refused
            if paced is not None and not paced.serves_lazily(table, max_tokens):
                # A policy plans a tight budget over a whole table, which this has none
                # of: the masks alone keep the output complete (docs/grammars.md).
                paced = None
            if report is not None:
                report.first_masks()
            return PreparedConstraint(table, None, budget_aware, paced, constraint), max_tokens
        if not isinstance(table, CompiledTable):  # first masks
            max_tokens = await asyncio.to_thread(
                self._lazy_budget, table, budget, budget_aware, paced, deadline
            )
            if max_tokens is not None:
                if report is not None:
                    report.first_masks()
                return PreparedConstraint(table, None, budget_aware, paced, constraint), max_tokens
            # A tight budget paced over the whole table, or a minimum past the bound.
            whole = await self._compiled(constraint, False, deadline, report)
            assert isinstance(whole, CompiledTable)  # compile answers first masks only if asked
            table = whole
        max_tokens = _budget(budget, table, budget_aware, thinking)
        prepared = PreparedConstraint(mask_source(table), table, budget_aware, paced, constraint)
        return prepared, max_tokens

    def _lazy_budget(
        self,
        source: LazyTable,
        budget: BudgetAsk,
        budget_aware: bool,
        policy: BudgetPolicy | None,
        deadline: float | None,
    ) -> int | None:
        """max_tokens of a request on first masks (in a thread: it may search), or None
        where it needs the whole table: its budget is tight (a policy paces it), or its
        minimum is past the bounded search. Raises as `_budget`."""
        try:
            with request_deadline(deadline if deadline is not None else float("inf")):
                max_tokens = _budget(budget, source, budget_aware)
                if policy is not None and not policy.serves_lazily(source, max_tokens):
                    return None
        except SearchTooLarge:
            return None
        return max_tokens

    async def _compiled(
        self,
        constraint: Constraint,
        first_mask: bool,
        deadline: float | None,
        report: PrepareReport | None,
    ) -> CompiledTable | LazyTable:
        """`compile`, its seconds charged to `report` the first time its table is handed out
        (first masks: when their compile ends)."""
        try:
            table = await self.compile(constraint, first_mask=first_mask, deadline=deadline)
        except ConstraintError as e:
            self._charge(report, e)
            raise
        if isinstance(table, CompiledTable):
            self._charge(report, table)
        elif table.compiled is None:  # its own compile, of the byte DFA alone
            if report is not None and self._charges.first_time(table):
                report.compile_seconds(table.compile_seconds)
        elif report is not None and self._charges.first_time(table):
            # The first request on first masks pays for the compile when it ends.
            loop = asyncio.get_running_loop()
            table.compiled.add_done_callback(
                lambda done: _on_loop(loop, self._charge_compiled, report, done)
            )
        return table

    def _charge(self, report: PrepareReport | None, outcome: CompiledTable | BaseException) -> None:
        """Charge `report` the seconds of a table, or of a compile stopped at its CPU limit,
        unless another request was charged them already."""
        if report is not None and isinstance(outcome, CompiledTable | CompileLimitError):
            if self._charges.first_time(outcome):
                report.compile_seconds(outcome.compile_seconds)

    def _charge_compiled(self, report: PrepareReport, compiled: Future[CompiledTable]) -> None:
        """`_charge` for the compile a request's first masks stood in for (on the loop): its
        outcome, also where it went on in the background past the pool's deadline."""
        if not compiled.cancelled():
            self._charge(report, compiled.exception() or compiled.result())


def _budget(
    budget: BudgetAsk,
    table: CompiledTable | MaskSource,
    budget_aware: bool,
    thinking: ThinkingSpec | None = None,
) -> int:
    """max_tokens: the request's, checked against the constraint's minimum (after the end of
    thinking, for a request that thinks first), or a default that fits it.

    Raises BudgetTooSmallError when a budget-aware constraint cannot finish in the request's
    budget. budget_aware=False skips the check."""
    if budget.requested is not None:
        if budget_aware:
            check_budget(table, budget.requested, budget.param, thinking=thinking)
        return budget.requested
    if thinking is not None:
        assert isinstance(table, CompiledTable)  # prepare plans a thinking phase on it
        return max(budget.floor, budget.factor * thinking.min_tokens(table))
    source = mask_source(table)
    if budget.factor * source.upper_bound(source.initial) <= budget.floor:
        return budget.floor  # what the exact minimum gives too, without its search
    return max(budget.floor, budget.factor * source.request_minimum())


async def _recurses(constraint: Constraint) -> bool:
    """Whether the constraint may recurse: a Lark grammar, a regex that calls grammars (a
    tool call's), or a JSON Schema with a `$ref` that leads back to itself (read off the
    event loop)."""
    if constraint.kind == "grammar" or constraint.calls:
        return True
    if constraint.kind != "json_schema" or '"$ref"' not in constraint.spec:
        return False
    return await asyncio.to_thread(_schema_recurses, constraint.spec)


def _calls_may_fit(constraint: Constraint) -> bool:
    """Whether a constraint refused as too large may fit written as frames that call each
    other: a JSON Schema not served so already."""
    return constraint.kind == "json_schema" and not constraint.pushdown


def _schema_recurses(spec: str) -> bool:
    from gclm.compiler.front.json_schema.frames import recursive_refs

    return recursive_refs(json.loads(spec))


def _on_loop(loop: asyncio.AbstractEventLoop, fn: Any, *args: Any) -> None:
    """Run `fn(*args)` on `loop` from another thread; not at all once the loop is closed."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, *args)
