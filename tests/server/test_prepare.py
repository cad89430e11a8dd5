"""A request's constraint prepared in one place (server/engine/prepare.py): first masks or the
whole table, the budget checked once, the compile charged once."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

import pytest

from gclm.compiler import CompiledTable, Constraint, compile_constraint
from gclm.compiler.front.regex import to_regex
from gclm.compiler.grown.lazy_table import LazyTable
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.byte_dfa import byte_dfa
from gclm.errors import BudgetTooSmallError, CompileLimitError, ConstraintError
from gclm.masking.reasoning import ThinkingSpec
from gclm.server.engine.prepare import PreparesConstraints
from gclm.server.engine.protocol import BudgetAsk

pytestmark = pytest.mark.anyio

BYTES = TokenVocabulary(
    (*(bytes([b]) for b in range(256)), b"ab", None), eos_token_id=257, scheme="plain"
)
AB = Constraint.regex("(ab){3,9}")  # 3 tokens at least ("ab" x 3)


class Report:
    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.first = 0

    def compile_seconds(self, seconds: float) -> None:
        self.seconds.append(seconds)

    def first_masks(self) -> None:
        self.first += 1


class Tight:
    """A policy that serves first masks only with 10 spare tokens or more."""

    name = "tight"

    def serves_lazily(self, source, budget: int) -> bool:
        return budget - source.request_minimum() >= 10

    def adjust(self, logits, state, tokens_left, budget) -> None:  # pragma: no cover
        pass


class Scripted(PreparesConstraints):
    """First masks (a LazyTable) when asked and `lazy`, else the whole table."""

    def __init__(self, lazy: bool = True, compiled: Future[CompiledTable] | None = None) -> None:
        self.whole = compile_constraint(AB, BYTES).with_info(compile_seconds=1.5)
        self.lazy = LazyTable(byte_dfa(to_regex(AB).regex), BYTES) if lazy else None
        if self.lazy is not None:
            self.lazy.compiled = compiled
            self.lazy.compile_seconds = 0.25
        self.asked: list[bool] = []  # first_mask, per compile

    async def compile(self, constraint, *, first_mask=False, deadline=None):
        await asyncio.sleep(0)
        self.asked.append(first_mask)
        return self.lazy if first_mask and self.lazy is not None else self.whole

    def budget_policy(self, name: str):
        return Tight() if name == "tight" else None


async def test_first_masks_carry_no_whole_table_and_are_reported() -> None:
    service, report = Scripted(), Report()
    prepared, max_tokens = await service.prepare(AB, BudgetAsk(8), report=report)
    assert prepared.masks is service.lazy and prepared.table is None
    assert prepared.compiled_from is AB and prepared.budget_aware and prepared.policy is None
    assert max_tokens == 8 and service.asked == [True]
    assert report.first == 1 and report.seconds == [0.25]  # its own compile, once
    await service.prepare(AB, BudgetAsk(8), report=report)
    assert report.seconds == [0.25]  # a request that finds it made pays nothing


async def test_a_whole_table_is_masked_by_its_mask_table() -> None:
    service, report = Scripted(lazy=False), Report()
    prepared, max_tokens = await service.prepare(AB, BudgetAsk(None, floor=4, factor=2))
    assert prepared.table is service.whole and prepared.masks.request_minimum() == 3
    assert max_tokens == 6  # max(floor 4, factor 2 x minimum 3)
    prepared, _ = await service.prepare(AB, BudgetAsk(5), report=report)
    assert report.seconds == [1.5] and report.first == 0


@pytest.mark.parametrize("lazy", [True, False])
async def test_a_budget_below_the_minimum_is_refused_naming_it(lazy: bool) -> None:
    with pytest.raises(BudgetTooSmallError, match="at least 3") as caught:
        await Scripted(lazy).prepare(AB, BudgetAsk(2, param="max_completion_tokens"))
    assert caught.value.param == "max_completion_tokens"
    # Switched off, the budget is not checked (the comparison mode).
    prepared, max_tokens = await Scripted(lazy).prepare(AB, BudgetAsk(2), budget_aware=False)
    assert max_tokens == 2 and not prepared.budget_aware


async def test_a_default_budget_fits_the_constraint_on_first_masks_too() -> None:
    prepared, max_tokens = await Scripted().prepare(AB, BudgetAsk(None, floor=2, factor=4))
    assert prepared.table is None and max_tokens == 12  # 4 x the exact minimum 3
    _, max_tokens = await Scripted().prepare(AB, BudgetAsk(None, floor=256, factor=4))
    assert max_tokens == 256  # the bound proves the floor enough, without a search


async def test_a_thinking_phase_waits_for_the_whole_table() -> None:
    service = Scripted()
    thinking = ThinkingSpec((ord("x"),))
    prepared, max_tokens = await service.prepare(AB, BudgetAsk(None), thinking=thinking)
    assert service.asked == [False] and prepared.table is service.whole
    assert max_tokens == max(256, 4 * thinking.min_tokens(service.whole))


async def test_a_tight_budget_a_policy_paces_gets_the_whole_table() -> None:
    service, report = Scripted(), Report()
    prepared, _ = await service.prepare(AB, BudgetAsk(20), policy="tight", report=report)
    assert prepared.table is None and isinstance(prepared.policy, Tight)  # 17 spare: lazily
    prepared, _ = await service.prepare(AB, BudgetAsk(5), policy="tight", report=report)
    assert service.asked == [True, True, False] and prepared.table is service.whole
    assert report.first == 1
    # No policy without the budget: nothing to pace.
    prepared, _ = await service.prepare(AB, BudgetAsk(5), policy="tight", budget_aware=False)
    assert prepared.policy is None


async def test_first_masks_of_a_whole_compile_pay_for_it_when_it_lands() -> None:
    compiled: Future[CompiledTable] = Future()
    service, report = Scripted(compiled=compiled), Report()
    await service.prepare(AB, BudgetAsk(8), report=report)
    await asyncio.sleep(0)
    assert report.seconds == []
    compiled.set_result(service.whole)
    for _ in range(3):
        await asyncio.sleep(0)
    assert report.seconds == [1.5]


async def test_a_compile_stopped_at_its_limit_is_charged_once_and_raised() -> None:
    stopped = CompileLimitError("too slow", compile_seconds=4.0)

    class Failing(Scripted):
        async def compile(self, constraint, *, first_mask=False, deadline=None):
            raise stopped if constraint is AB else ConstraintError("no")

    service, report = Failing(), Report()
    for _ in range(2):
        with pytest.raises(CompileLimitError):
            await service.prepare(AB, BudgetAsk(8), report=report)
    with pytest.raises(ConstraintError):
        await service.prepare(Constraint.regex("x"), BudgetAsk(8), report=report)
    assert report.seconds == [4.0] and report.first == 0
