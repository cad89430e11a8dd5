"""A constraint's LazyTable in the table cache, from its FIRST compile to the whole table.

`FirstTables.fetch` answers a request that needs no whole table with masks walked state by
state from the constraint's byte DFA (compiler/grown/lazy_table.py): a LazyTable kept in
the table cache under its own key beside the table's (`first_key`), counted by what it has
walked, from a compile of the DFA alone (`FirstMasks.compile`), which is kept on disk too.
The whole table is compiled only when `TableCache.fetch` asks for it (a request whose
budget binds, or that thinks first); once it lands, it answers both and the cache drops the
LazyTable. A whole compile in flight answers with its DFA's LazyTable if that comes first.

The cache keeps what this module hands it, and runs the flights (single-flight, `abandon`,
following a compile past a 429); what a LazyTable is, where it comes from and when the
whole table stands in for it are decided here.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.service.cache import TableCache, first_key
from gclm.compiler.service.compile_job import Compiling, copy_outcome, settle
from gclm.compiler.whole.tables import CompiledTable
from gclm.errors import CompileLimitError

if TYPE_CHECKING:
    from gclm.compiler.grown.lazy_table import LazyTable
    from gclm.compiler.service.first_mask import FirstMasksSource

log = logging.getLogger("gclm.compiler")


class FirstTables:
    """LazyTables for the requests that can start on first masks, kept in `cache`.

    Args:
        cache: the table cache (it compiles whole tables, and keeps what this hands it).
        source: where LazyTables come from.
    """

    def __init__(self, cache: TableCache, source: FirstMasksSource) -> None:
        self.cache = cache
        self.source = source

    def fetch(self, constraint: Constraint) -> Compiling[Any]:
        """The table where it is known (cached, on disk or compiling), else a LazyTable of
        the constraint's byte DFA: the same masks, walked as generation reaches states (one
        walk for the first mask). A whole compile in flight answers with its DFA's LazyTable
        if that comes first. Single-flight, as `TableCache.fetch`."""
        cache = self.cache
        key = cache.key(constraint)
        first = first_key(key)
        found, answer = cache.find_stand_in(key, first)
        if found == "table":
            return self._first_of_whole(constraint)
        if found != "claimed":
            return answer
        try:
            table = cache.load_table(key)
        except CompileLimitError as e:
            cache.fail(first, e, remember=key)
            return answer
        if table is not None:
            self._compiled(key, Compiling.ended(table), constraint, stored=True)
            return answer
        stored = cache.disk.load(first) if cache.disk is not None else None
        if stored is not None:  # the byte DFA of a FIRST compile before a restart
            made = self.source.from_dfa(stored)
            made.add_done_callback(lambda f: cache.hand_off(self._stored, key, f, constraint))
            return answer
        self._compile(key, constraint)
        return answer

    def gauges(self) -> dict[str, float]:
        """The source's counters, for /metrics."""
        return self.source.gauges()

    def wait_warm(self, timeout: float | None = None) -> bool:
        """Block until the source's compiled functions are loaded (True), or `timeout` (see
        `FirstMasks.wait_warm`)."""
        return self.source.wait_warm(timeout)

    def _compile(self, key: str, constraint: Constraint) -> None:
        compiled = self.source.compile(constraint)
        self.cache.fly(first_key(key), compiled, lambda f: self._compiled(key, f, constraint))

    def _stored(self, key: str, made: Future[LazyTable | None], constraint: Constraint) -> None:
        """A LazyTable from disk; a damaged file is dropped and the DFA compiled again."""
        if made.result() is None:
            if self.cache.disk is not None:
                self.cache.disk.discard(first_key(key))
            self._compile(key, constraint)
            return
        self.cache.count_disk_hit()
        self._compiled(key, made, constraint, stored=True)

    def _first_of_whole(self, constraint: Constraint) -> Compiling[Any]:
        """The cache's answer for the table, or sooner the LazyTable of the whole compile
        in flight."""
        whole = self.cache.fetch(constraint)
        if whole.done():
            return whole
        lazy = self.source(constraint)
        if lazy is None:
            return whole
        self.cache.keep(whole)  # its requests are counted on the future made of it, not on it
        return _first_of(lazy, whole)

    def _compiled(
        self, key: str, compiled: Future[Any], constraint: Constraint, *, stored: bool = False
    ) -> None:
        """A FIRST compile (or a disk hit, `stored`) ended: keep what it made, answer its
        requests."""
        cache, first = self.cache, first_key(key)
        try:
            result = compiled.result()
        except BaseException as e:
            cache.fail(first, e, compiled, remember=key, landed=self._landed_later)
            return
        if result is None:  # no LazyTable after all: the whole table answers
            answer = cache.take_answer(first)
            whole = cache.fetch(constraint)
            cache.keep(whole)  # the FIRST compile's requests wait for it
            answer.follow(whole.outcome)
            whole.add_done_callback(lambda f: copy_outcome(f, answer))
            return
        try:
            self._land(key, result, stored=stored)
        except BaseException as e:  # measuring builds mask rows: a bad table fails here
            cache.fail(first, e, remember=key)
            return
        cache.take_answer(first).end(result)

    def _land(self, key: str, result: CompiledTable | LazyTable, *, stored: bool) -> None:
        """Keep a FIRST compile's LazyTable (and its DFA on disk), or the whole table it made
        instead."""
        if isinstance(result, CompiledTable):
            self.cache.keep_table(key, result, stored=stored)
            return
        data = result.stored_dfa()
        if not stored and self.cache.disk is not None and data is not None:
            self.cache.disk.store(first_key(key), data)
        self.cache.keep_stand_in(key, first_key(key), result, result.nbytes)

    def _landed_later(self, key: str, compiled: Future[Any]) -> None:
        """A FIRST compile went on past its requests' deadline and ended: keep its outcome
        for the retry the 429 asked for."""
        error: BaseException | None = None
        try:
            result = compiled.result()
            if result is not None:
                self._land(key, result, stored=False)
        except BaseException as e:
            error = e
        self.cache.landed_later(first_key(key), key, error)


def _first_of(
    lazy: Future[LazyTable | None], whole: Compiling[CompiledTable]
) -> Compiling[CompiledTable | LazyTable]:
    """The LazyTable if it comes before the table, else the table (or its error)."""
    out: Compiling[CompiledTable | LazyTable] = Compiling()
    out.follow(whole.outcome)

    def answer(source: Future[Any]) -> None:
        try:
            result = source.result()
        except BaseException as e:
            if source is lazy:  # no masks ahead of the table: wait for it
                return
            settle(out, e)
            return
        if result is None:  # no LazyTable for this constraint
            return
        if source is lazy and result.compiled is None:
            result.compiled = whole.outcome  # the compile it stands in for (its cost: prepare.py)
        settle(out, result)  # unless the other came first

    lazy.add_done_callback(answer)
    whole.add_done_callback(answer)
    return out
