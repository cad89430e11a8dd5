"""The engine's constraint service (server/engine/constraints.py): tables with their mask rows,
first masks only for an engine that serves them, policies and gauges."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

import pytest

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex
from gclm.compiler.grown.lazy_table import LazyTable
from gclm.compiler.service.cache import TableCache
from gclm.compiler.service.first_mask import lazy_table
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.byte_dfa import byte_dfa
from gclm.compiler.whole.compile import compile_constraint
from gclm.compiler.whole.tables import CompiledTable
from gclm.masking.graceful import GracefulPolicy
from gclm.masking.masks import _CACHE as MASK_TABLES
from gclm.server.engine.constraints import Constraints

pytestmark = pytest.mark.anyio

BYTES = TokenVocabulary(
    (*(bytes([b]) for b in range(256)), b"ab", None), eos_token_id=257, scheme="plain"
)
AB = Constraint.regex("(ab){1,4}")


def held_cache(with_source: bool = True) -> tuple[TableCache, list[Future[CompiledTable]]]:
    """A cache whose compiles never land unless the test lands them, with a source of
    first masks unless `with_source` is False."""
    held: list[Future[CompiledTable]] = []

    def compile_fn(constraint: Constraint) -> Future[CompiledTable]:
        held.append(Future())
        return held[-1]

    source = DfaMasks() if with_source else None
    return TableCache(compile_fn, BYTES.fingerprint, first_masks=source), held


class DfaMasks:
    """First masks at once, from the byte DFA: of a compile in flight, or of a FIRST one."""

    def __call__(self, constraint: Constraint) -> Future[LazyTable | None]:
        future: Future[LazyTable | None] = Future()
        future.set_result(lazy_table(byte_dfa(to_regex(constraint).regex), BYTES))
        return future

    def compile(self, constraint: Constraint) -> Future[CompiledTable | LazyTable | None]:
        return self(constraint)  # type: ignore[return-value]

    def gauges(self) -> dict[str, float]:
        return {}


async def test_a_table_comes_with_its_mask_rows() -> None:
    service = Constraints(BYTES, TableCache(lambda c: compile_constraint(c, BYTES), "v"))
    table = await service.compile(AB)
    assert isinstance(table, CompiledTable) and table in MASK_TABLES
    service.close()


async def test_first_masks_only_when_asked() -> None:
    cache, held = held_cache()
    service = Constraints(BYTES, cache)
    lazy = await service.compile(AB, first_mask=True)
    assert isinstance(lazy, LazyTable)
    # Not asked: the table, once compiled, with its mask rows.
    waiting = asyncio.ensure_future(service.compile(AB))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    table = compile_constraint(AB, BYTES)
    held[0].set_result(table)
    assert await waiting is table and table in MASK_TABLES
    service.close()


@pytest.mark.parametrize("case", ["masks elsewhere", "no source"])
async def test_whole_tables_only_where_no_first_masks_are_served(case: str) -> None:
    """vLLM's engine (first masks off), or a cache that carries no source of them: asked
    for first masks, it waits for the table all the same."""
    cache, held = held_cache(with_source=case == "masks elsewhere")
    service = Constraints(BYTES, cache, first_masks=case != "masks elsewhere")
    assert service.first_tables is None
    waiting = asyncio.ensure_future(service.compile(AB, first_mask=True))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    table = compile_constraint(AB, BYTES)
    held[0].set_result(table)
    assert await waiting is table
    service.close()


def test_policies_and_gauges() -> None:
    service = Constraints(BYTES, TableCache(lambda c: compile_constraint(c, BYTES), "v"))
    assert isinstance(service.budget_policy("graceful"), GracefulPolicy)
    assert service.budget_policy("graceful") is service.budget_policy("graceful")
    assert service.budget_policy("none") is None
    assert service.gauges()["table_cache_entries"] == 0  # no pool: the cache's gauges only
    service.close()
