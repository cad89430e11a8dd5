"""A background compile's table, between the compile's end and the cache keeping it.

Keeping a large table means measuring it (the server builds its mask table: 1.9 s for a
43k-state table on a quiet core). A retry that arrived in that window used to find neither
an entry nor a compile in flight and started the compile again from zero (the load
benchmark's `array_of_texts`: 429, 429, then a third 429 from a fresh compile).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.service.cache import TableCache
from gclm.compiler.service.compile_job import Compiling
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.compile import compile_constraint
from gclm.compiler.whole.tables import CompiledTable
from gclm.errors import CompileLimitError, CompilerBusyError

ABC = TokenVocabulary((b"a", b"b", b"ab", None), 3, "plain")
AB = Constraint.regex("(ab)+")


class BackgroundCompiler:
    """Each call: a 429 whose compile goes on in `outcome`, resolved by the test."""

    def __init__(self) -> None:
        self.calls = 0
        self.outcome: Future[CompiledTable] = Future()

    def __call__(self, constraint: Constraint) -> Compiling[CompiledTable]:
        self.calls += 1
        busy: Compiling[CompiledTable] = Compiling()
        busy.follow(self.outcome)
        busy.set_exception(CompilerBusyError("busy", 3.0))
        return busy


class SlowMeasure:
    """A measure that waits for `release`, as a large table's mask build takes seconds."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()

    def __call__(self, table: CompiledTable) -> int:
        self.started.set()
        assert self.release.wait(30)
        return table.nbytes


def busy_then_landing() -> tuple[BackgroundCompiler, SlowMeasure, TableCache]:
    compiler, measure = BackgroundCompiler(), SlowMeasure()
    cache = TableCache(compiler, ABC.fingerprint, measure=measure)
    first = cache.fetch(AB)
    assert isinstance(first.exception(5), CompilerBusyError)
    return compiler, measure, cache


def test_a_retry_while_the_background_table_is_being_kept_waits_for_it() -> None:
    compiler, measure, cache = busy_then_landing()
    table = compile_constraint(AB, ABC)
    compiler.outcome.set_result(table)
    assert measure.started.wait(10)
    retry = cache.fetch(AB)
    assert compiler.calls == 1  # no second compile
    assert not retry.done()
    measure.release.set()
    assert retry.result(10) is table
    assert cache.get(AB) is table and compiler.calls == 1


def test_a_retry_while_a_background_failure_lands_gets_the_failure() -> None:
    compiler, measure, cache = busy_then_landing()
    compiler.outcome.set_exception(CompileLimitError("too costly"))
    failed = cache.fetch(AB)
    assert isinstance(failed.exception(10), CompileLimitError)
    assert isinstance(cache.fetch(AB).exception(1), CompileLimitError)
    assert compiler.calls == 1 and not measure.started.is_set()
