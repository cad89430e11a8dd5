"""Compiles that finish and are remembered: a compile outlives the request that timed out
waiting for it, its table lands in the cache for the retry, and a constraint past its CPU
ceiling is refused at once from then on. Real worker processes, real slow schemas."""

from __future__ import annotations

import time

import pytest

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.service.cache import TableCache
from gclm.compiler.service.pool import CompilerPool
from gclm.compiler.service.worker import CompileLimits
from gclm.errors import CompileLimitError, CompilerBusyError


def medium(i: int) -> Constraint:
    """Six bounded free-text fields: about 3 s of CPU at this vocabulary on a quiet core
    (one of maxLength 100 took 0.23 s, inside a 0.3 s timeout's reach); `i` makes each
    distinct."""
    props = {f"note{j}_{i}": {"type": "string", "maxLength": 400} for j in range(6)}
    return Constraint.json_schema({"type": "object", "properties": props})


def bomb(i: int) -> Constraint:
    """Twenty free-text fields of 256 characters: about 12 s of CPU."""
    props = {f"f{j}_{i}": {"type": "string", "maxLength": 256} for j in range(20)}
    return Constraint.json_schema({"type": "object", "properties": props})


def compiler(vocab, timeout_s: float, cpu_s: float) -> tuple[CompilerPool, TableCache]:
    pool = CompilerPool(vocab, CompileLimits(timeout_s=timeout_s, cpu_s=cpu_s), workers=1)
    assert pool.wait_ready(120)
    return pool, TableCache(pool.submit, vocab.fingerprint)


def test_a_timed_out_compile_finishes_in_the_background_and_the_retry_finds_it(
    embedded_vocab,
) -> None:
    pool, cache = compiler(embedded_vocab, timeout_s=0.3, cpu_s=120)
    try:
        answer = cache.fetch(medium(0))
        busy = answer.exception(timeout=300)
        assert isinstance(busy, CompilerBusyError)
        assert busy.code == "compiler_busy" and busy.retry_after >= 1
        assert "goes on in the background" in busy.message
        assert pool.gauges()["compiles_background"] == 1
        # A retry joins the running compile with its own deadline: it times out again or,
        # on a fast machine where the compile finished meanwhile, gets its table. Either
        # way no second compile starts (asserted below from the pool's counters).
        try:
            retried = cache.get(medium(0))
        except CompilerBusyError as again:
            assert again.code == "compiler_busy"
            retried = None
        table = answer.outcome.result(timeout=300)
        assert retried is None or retried is table
        deadline = time.monotonic() + 10  # the cache stores it on its own thread
        while cache.gauges()["table_cache_entries"] == 0:
            assert time.monotonic() < deadline, "the table never landed in the cache"
            time.sleep(0.05)
        hit = cache.fetch(medium(0))
        assert hit.done() and hit.result() is table  # the retry: at once, from memory
        assert pool.stats.compiles == 1 and pool.stats.background == 1
        assert pool.stats.cpu_seconds > 0
        assert pool.gauges()["compiles_background"] == 0
    finally:
        pool.close()


def test_a_constraint_past_its_cpu_ceiling_is_refused_at_once_from_then_on(
    embedded_vocab,
) -> None:
    pool, cache = compiler(embedded_vocab, timeout_s=0.3, cpu_s=1.0)
    try:
        answer = cache.fetch(bomb(0))
        first = answer.exception(timeout=300)
        if isinstance(first, CompilerBusyError):  # starved by the deadline: goes on
            final = answer.outcome.exception(timeout=300)
            assert isinstance(final, CompileLimitError)
            time.sleep(0.5)  # the cache remembers it on its own thread
        else:
            assert isinstance(first, CompileLimitError)
        compiles = pool.stats.compiles + pool.stats.timeouts
        for _ in range(3):
            again = cache.fetch(bomb(0))
            assert again.done(), "a remembered failure must not wait for the compiler"
            error = again.exception()
            assert isinstance(error, CompileLimitError) and error.code == "compile_limit"
            assert "more than 1 s of CPU time" in error.message
        assert pool.stats.compiles + pool.stats.timeouts == compiles  # no CPU spent again
        assert pool.stats.timeouts == 1
        assert pool.gauges()["compiles_cpu_limited"] == 1
    finally:
        pool.close()


def test_a_retry_of_a_queued_compile_joins_it(embedded_vocab) -> None:
    pool = CompilerPool(embedded_vocab, CompileLimits(timeout_s=60, cpu_s=120), workers=1)
    try:
        assert pool.wait_ready(120)
        first, second = pool.submit(medium(1)), pool.submit(medium(1))
        assert first.result(timeout=300) is second.result(timeout=300)
        assert pool.stats.compiles == 1
    finally:
        pool.close()


def test_a_compile_nobody_waits_for_is_reniced_and_shed_past_the_memory_budget(
    embedded_vocab,
) -> None:
    """Once its request got its 429, a demoted compile runs at UNWAITED_NICE; while such
    compiles together hold more than `unwaited_bytes` resident (here: any), the largest is
    stopped as busy, not remembered, and counted."""
    import os

    from gclm.compiler.service.pool import UNWAITED_NICE

    pool = CompilerPool(
        embedded_vocab, CompileLimits(timeout_s=0.3, cpu_s=120), workers=1, unwaited_bytes=0
    )
    assert pool.wait_ready(120)
    cache = TableCache(pool.submit, embedded_vocab.fingerprint)
    try:
        answer = cache.fetch(bomb(7))
        assert isinstance(answer.exception(timeout=300), CompilerBusyError)
        compiling = answer.outcome
        # Reniced once demoted with nobody waiting (only such compiles are ever shed).
        deadline = time.monotonic() + 30
        niced: list[int] = []
        while not niced and not compiling.done() and time.monotonic() < deadline:
            niced = [
                os.getpriority(os.PRIO_PROCESS, p.worker.process.pid)
                for p in list(pool._procs)
                if p.unwaited and p.job is not None
            ]
            time.sleep(0.01)
        assert niced == [] or niced == [UNWAITED_NICE]
        with pytest.raises(CompilerBusyError, match="stopped to make room"):
            compiling.result(timeout=60)
        assert pool.gauges()["compiles_shed"] == 1
        # Not remembered: once the cache has let go of it, the next request compiles it
        # again (and waits its own timeout).
        deadline = time.monotonic() + 10
        while cache._flights and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(CompilerBusyError):
            cache.get(bomb(7))
        assert pool.gauges()["compiles_started"] == 2
    finally:
        pool.close()


def wait_until(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_compile_every_request_left_is_stopped_and_not_remembered(embedded_vocab) -> None:
    # Nobody got a 429 for it (so nobody is to retry): the worker is stopped, not left to
    # run to its CPU ceiling, and the next request compiles the constraint again.
    pool, cache = compiler(embedded_vocab, timeout_s=60, cpu_s=120)
    try:
        asked = cache.fetch(bomb(1))
        wait_until(lambda: pool.gauges()["compiles_running"] == 1, 30, "it never started")
        assert cache.abandon(asked)
        wait_until(lambda: pool.gauges()["compiles_running"] == 0, 5, "it was not stopped")
        assert pool.stats.abandoned == 1 and pool.stats.compiles == 0
        error = asked.exception(timeout=5)
        assert isinstance(error, CompilerBusyError) and "every request" in error.message
        assert cache.gauges()["table_cache_negative_entries"] == 0  # not remembered
        again = cache.fetch(bomb(1))
        assert again is not asked and not again.done()  # compiled anew
        wait_until(lambda: pool.gauges()["compiles_running"] == 1, 30, "no new compile")
    finally:
        pool.close()


def test_a_compile_a_request_was_told_to_retry_goes_on_when_the_others_leave(
    embedded_vocab,
) -> None:
    pool, cache = compiler(embedded_vocab, timeout_s=0.3, cpu_s=120)
    try:
        told = cache.fetch(bomb(2))  # about 12 s of CPU: a 429, and its client is to retry
        assert isinstance(told.exception(timeout=300), CompilerBusyError)
        joined = cache.fetch(bomb(2))  # another request joins the compile that goes on...
        assert cache.abandon(joined)  # ...and leaves before its answer
        time.sleep(2.5)  # the pool looks at its jobs at least once a second
        assert pool.gauges()["compiles_running"] == 1 and not told.outcome.done()
        assert pool.stats.abandoned == 0
    finally:
        pool.close()
