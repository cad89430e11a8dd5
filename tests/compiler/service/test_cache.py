"""The table cache: keys, LRU by bytes, disk, single-flight, negative entries."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from concurrent.futures import Future

import pytest

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.service.cache import TableCache, cache_key
from gclm.compiler.service.compile_job import Compiling
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.compile import compile_constraint
from gclm.errors import CompileLimitError, CompilerBusyError, ConstraintError

ABC = TokenVocabulary((b"a", b"b", b"ab", None), 3, "plain")


class CountingCompiler:
    def __init__(self, delay: float = 0.0):
        self.calls: list[Constraint] = []
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self, constraint: Constraint):
        with self.lock:
            self.calls.append(constraint)
        time.sleep(self.delay)
        return compile_constraint(constraint, ABC)


def test_key_depends_on_constraint_whitespace_and_vocabulary():
    a = Constraint.json_schema({"type": "string"})
    assert cache_key(a, "v1") == cache_key(Constraint.json_schema('{"type":  "string"}'), "v1")
    assert cache_key(a, "v1") != cache_key(a, "v2")
    assert cache_key(a, "v1") != cache_key(Constraint.json_schema({"type": "string"}, "[ ]*"), "v1")
    assert cache_key(Constraint.regex("ab"), "v") != cache_key(Constraint.choice(["ab"]), "v")


def test_hit_returns_the_same_table_fast():
    compiler = CountingCompiler()
    cache = TableCache(compiler, ABC.fingerprint)
    first = cache.get(Constraint.regex("(ab)+"))
    started = time.perf_counter()
    again = cache.get(Constraint.regex("(ab)+"))
    assert time.perf_counter() - started < 0.001
    assert again is first and len(compiler.calls) == 1
    assert (cache.stats.hits, cache.stats.misses) == (1, 1)


def test_lru_is_bounded_in_bytes():
    compiler = CountingCompiler()
    one = compile_constraint(Constraint.regex("a"), ABC).nbytes
    cache = TableCache(compiler, ABC.fingerprint, max_bytes=int(2.5 * one))
    for rx in ("a", "b", "ab", "a"):
        cache.get(Constraint.regex(rx))
    assert cache.nbytes <= cache.max_bytes
    assert len(compiler.calls) == 4  # "a" was evicted by the third before coming back


def test_disk_cache_survives_a_restart(tmp_path):
    compiler = CountingCompiler()
    TableCache(compiler, ABC.fingerprint, disk_dir=tmp_path).get(Constraint.regex("ab|b"))
    assert len(list(tmp_path.glob("*.npz"))) == 1
    restarted = TableCache(compiler, ABC.fingerprint, disk_dir=tmp_path)
    table = restarted.get(Constraint.regex("ab|b"))
    assert len(compiler.calls) == 1 and restarted.stats.disk_hits == 1
    assert table.min_tokens == 1
    # A damaged file is recompiled, not trusted.
    next(tmp_path.glob("*.npz")).write_bytes(b"not a table")
    TableCache(compiler, ABC.fingerprint, disk_dir=tmp_path).get(Constraint.regex("ab|b"))
    assert len(compiler.calls) == 2


def test_single_flight_compiles_once_for_concurrent_requests():
    compiler = CountingCompiler(delay=0.2)
    cache = TableCache(compiler, ABC.fingerprint)
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(cache.get(Constraint.regex("(ab){2}"))))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(compiler.calls) == 1
    assert len(results) == 8 and all(r is results[0] for r in results)


def test_failures_are_cached_negatively():
    compiler = CountingCompiler()
    cache = TableCache(compiler, ABC.fingerprint, negative_ttl_s=60)
    for _ in range(3):
        with pytest.raises(ConstraintError):
            cache.get(Constraint.regex("c"))  # no token spells "c"
    assert len(compiler.calls) == 1 and cache.stats.negative_hits == 2
    expired = TableCache(compiler, ABC.fingerprint, negative_ttl_s=0)
    for _ in range(2):
        with pytest.raises(ConstraintError):
            expired.get(Constraint.regex("c"))
    assert len(compiler.calls) == 3


def test_budget_counts_what_measure_adds():
    # The probe: only table.nbytes was counted, not the table's mask rows (1.7-2.7 MB each).
    compiler = CountingCompiler()
    cache = TableCache(compiler, ABC.fingerprint, max_bytes=25_000, measure=lambda t: 10_000)
    for rx in ("a", "b", "ab", "ba"):
        cache.get(Constraint.regex(rx))
        assert cache.nbytes <= cache.max_bytes
    assert cache.gauges()["table_cache_entries"] == 2
    assert cache.stats.evictions == 2


def test_remeasured_growth_is_evicted():
    sizes = {}
    compiler = CountingCompiler()
    cache = TableCache(
        compiler, ABC.fingerprint, max_bytes=25_000, measure=lambda t: sizes.get(id(t), 10_000)
    )
    first = cache.get(Constraint.regex("a"))
    cache.get(Constraint.regex("b"))
    sizes[id(first)] = 20_000  # its mask rows grew while decoding
    assert cache.gauges()["table_cache_bytes"] <= 25_000
    assert cache.gauges()["table_cache_entries"] == 1


def test_negative_entries_count_against_the_budget():
    compiler = CountingCompiler()
    cache = TableCache(compiler, ABC.fingerprint, max_bytes=5_000, measure=lambda t: 2_000)
    cache.get(Constraint.regex("a"))
    for rx in ("c", "cc", "ccc", "cccc"):  # no token spells "c"
        with pytest.raises(ConstraintError):
            cache.get(Constraint.regex(rx))
        assert cache.nbytes <= cache.max_bytes
    gauges = cache.gauges()
    assert gauges["table_cache_negative_entries"] >= 1
    assert gauges["table_cache_entries"] == 0  # the table made room for newer failures


def test_busy_refusals_are_not_remembered():
    calls = []

    def compile_fn(constraint):
        calls.append(constraint)
        future = Future()
        if len(calls) == 1:
            future.set_exception(CompilerBusyError("busy"))
        else:
            future.set_result(compile_constraint(constraint, ABC))
        return future

    cache = TableCache(compile_fn, ABC.fingerprint)
    with pytest.raises(CompilerBusyError):
        cache.get(Constraint.regex("ab"))
    assert cache.get(Constraint.regex("ab")).min_tokens == 1
    assert len(calls) == 2


def test_fetch_never_waits_behind_a_compile(tmp_path):
    pending: Future = Future()
    compiled = compile_constraint(Constraint.regex("b"), ABC)

    def compile_fn(constraint):
        return pending if constraint.spec == "a" else compiled

    cache = TableCache(compile_fn, ABC.fingerprint, disk_dir=tmp_path)
    cache.get(Constraint.regex("b"))
    slow = cache.fetch(Constraint.regex("a"))
    again = cache.fetch(Constraint.regex("a"))
    assert again is slow and not slow.done()  # single-flight, still compiling
    hit = cache.fetch(Constraint.regex("b"))
    assert hit.done() and hit.result() is compiled
    restarted = TableCache(compile_fn, ABC.fingerprint, disk_dir=tmp_path)
    assert restarted.fetch(Constraint.regex("b")).done()  # a disk hit is done at once too
    pending.set_result(compile_constraint(Constraint.regex("a"), ABC))
    assert slow.result(timeout=5).min_tokens == 1


def busy_while(compiling: Future, error: CompilerBusyError) -> Compiling:
    """The pool's answer at a request's deadline: `error`, while the compile goes on to
    `compiling`."""
    answer: Compiling = Compiling()
    answer.follow(compiling)
    answer.set_exception(error)
    return answer


def test_a_busy_refusal_whose_compile_goes_on_lands_in_the_cache(tmp_path):
    # The pool answers a request 429 at its deadline while the compile goes on; the table
    # it ends with must be found by the retry, from memory and after a restart from disk.
    compiling: Future = Future()
    calls = []

    def compile_fn(constraint):
        calls.append(constraint)
        return busy_while(compiling, CompilerBusyError("still compiling", 3.0))

    cache = TableCache(compile_fn, ABC.fingerprint, disk_dir=tmp_path)
    with pytest.raises(CompilerBusyError) as caught:
        cache.get(Constraint.regex("ab"))
    assert caught.value.retry_after == 3.0
    table = compile_constraint(Constraint.regex("ab"), ABC)
    compiling.set_result(table)
    deadline = time.monotonic() + 5
    while cache.gauges()["table_cache_entries"] == 0:
        assert time.monotonic() < deadline, "the background table never landed"
        time.sleep(0.02)
    assert cache.get(Constraint.regex("ab")) is table and len(calls) == 1
    restarted = TableCache(compile_fn, ABC.fingerprint, disk_dir=tmp_path)
    assert restarted.fetch(Constraint.regex("ab")).result().min_tokens == 1


def test_a_background_compile_past_its_limit_is_remembered_for_good():
    compiling: Future = Future()
    calls = []

    def compile_fn(constraint):
        calls.append(constraint)
        return busy_while(compiling, CompilerBusyError("still compiling"))

    # A TTL of 0 forgets other failures at once; a compile limit does not depend on load.
    cache = TableCache(compile_fn, ABC.fingerprint, negative_ttl_s=0)
    with pytest.raises(CompilerBusyError):
        cache.get(Constraint.regex("ab"))
    compiling.set_exception(CompileLimitError("more than 10 s of CPU time"))
    deadline = time.monotonic() + 5
    while cache.gauges()["table_cache_negative_entries"] == 0:
        assert time.monotonic() < deadline, "the failure was never remembered"
        time.sleep(0.02)
    for _ in range(3):
        with pytest.raises(CompileLimitError, match="CPU time"):
            cache.get(Constraint.regex("ab"))
    assert len(calls) == 1


def test_a_compile_limit_is_remembered_on_disk_under_the_same_limits(tmp_path):
    calls = []

    def compile_fn(constraint):
        calls.append(constraint)
        raise CompileLimitError("used more than 60 s of CPU time")

    bomb = Constraint.regex("ab")
    first = TableCache(compile_fn, ABC.fingerprint, disk_dir=tmp_path, limits_tag="cpu=60")
    with pytest.raises(CompileLimitError):
        first.get(bomb)
    # After a restart: refused at once, without compiling again.
    restarted = TableCache(compile_fn, ABC.fingerprint, disk_dir=tmp_path, limits_tag="cpu=60")
    refused = restarted.fetch(bomb)
    assert refused.done() and "60 s of CPU" in refused.exception().message
    assert len(calls) == 1
    # Other constraints, and the same one under raised limits, compile.
    raised = TableCache(compile_fn, ABC.fingerprint, disk_dir=tmp_path, limits_tag="cpu=600")
    with pytest.raises(CompileLimitError):
        raised.get(bomb)
    with pytest.raises(CompileLimitError):
        restarted.get(Constraint.regex("ba"))
    assert len(calls) == 3
    # One small file per (constraint, limits).
    assert sum(1 for _ in (tmp_path / "failures").iterdir()) == 3


def test_a_compile_that_ends_after_the_cache_closed_is_dropped_quietly(caplog):
    # A server shutting down closes its cache while compiles go on in the workers; the
    # one that ends then raised in its done-callback ("cannot schedule new futures after
    # shutdown") and left a traceback in the shutdown's log.
    pending: Future = Future()
    cache = TableCache(lambda constraint: pending, ABC.fingerprint)
    asked = cache.fetch(Constraint.regex("a"))
    cache.close()
    with caplog.at_level("DEBUG"):
        pending.set_result(compile_constraint(Constraint.regex("a"), ABC))
    assert not asked.done()  # nobody waits for it any more: the server is gone
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert "after the table cache closed" in caplog.text


def test_a_compile_that_ended_is_not_held_for_abandon() -> None:
    # The future handed out and its table go once nobody holds them (the cache's own
    # entry aside): what `abandon` keeps for a compile in flight is let go when it ends.
    sources: list[Future] = [Future()]  # the compile's future, dropped below as a pool would
    cache = TableCache(lambda constraint: sources[0], ABC.fingerprint)
    asked = cache.fetch(Constraint.regex("a"))
    sources[0].set_result(compile_constraint(Constraint.regex("a"), ABC))
    asked.result(timeout=5)
    handed = weakref.ref(asked)
    del asked
    sources.clear()
    gc.collect()
    assert handed() is None


def test_a_precompiled_constraint_is_not_stopped_by_a_request_that_leaves() -> None:
    from gclm.server.launch import COMMON_CONSTRAINTS, precompile

    source: Future = Future()
    cache = TableCache(lambda constraint: source, ABC.fingerprint)
    precompile(cache)
    joined = cache.fetch(COMMON_CONSTRAINTS[0])  # a request joins it...
    assert not cache.abandon(joined)  # ...and leaves: start-up still wants it
    assert not source.cancelled()
    source.cancel()


def test_an_abandoned_compile_is_not_followed_and_the_next_request_compiles_again() -> None:
    # Every request left: the cache cancels the compile, and the pool stops it. Its outcome
    # ends later (the pool's next round): the cache must not wait for that outcome in the
    # background, or the next request would join the stopped compile's end and get its
    # "every request left" 429 instead of a compile of its own.
    sent: list[Compiling] = []

    def compile_fn(constraint: Constraint) -> Compiling:
        sent.append(Compiling())
        return sent[-1]

    cache = TableCache(compile_fn, ABC.fingerprint)
    asked = cache.fetch(Constraint.regex("ab"))
    assert cache.abandon(asked) and sent[0].cancelled()
    error = asked.exception(timeout=5)
    assert isinstance(error, CompilerBusyError) and "every request" in error.message
    sent[0].outcome.set_exception(CompilerBusyError("stopped: every request left"))
    again = cache.fetch(Constraint.regex("ab"))
    assert len(sent) == 2 and again is not asked and not again.done()
    table = compile_constraint(Constraint.regex("ab"), ABC)
    sent[1].set_result(table)
    assert again.result(timeout=5) is table
