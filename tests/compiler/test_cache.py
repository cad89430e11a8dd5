"""The table cache: keys, LRU by bytes, disk, single-flight, negative entries."""

from __future__ import annotations

import threading
import time

import pytest

from gclm.compiler.cache import TableCache, cache_key
from gclm.compiler.compile import compile_constraint
from gclm.compiler.constraint import Constraint
from gclm.compiler.vocabulary import TokenVocabulary
from gclm.errors import ConstraintError

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
