"""Compiled tables, cached once per (constraint, whitespace, vocabulary).

- Memory: one LRU bounded in bytes, counting everything a cached schema holds: the table,
  what `measure` adds to it (the server counts the table's mask rows and tight-row
  ladders, which are larger than the table itself), and the failures remembered as
  negative entries. Before, only the table's own bytes were counted, and memory grew by
  ~2 MB per distinct schema with no plateau.
- Disk (optional): one `<key>.npz` per table with its own cap (compiler/service/disk_cache.py),
  and one small `failures/<key>.txt` per constraint that ran past a compile limit, keyed
  with the limits too (`limits_tag`): a restart does not pay for a compile bomb again,
  and raising a limit forgets the failures it caused.
- Single-flight: concurrent requests for one new constraint wait on one compile.
- Negative: a constraint that failed fails again at once, for `negative_ttl_s`; one that
  ran past a compile limit (CPU seconds, memory, states: a CompileLimitError) for as long
  as it is cached, since those limits do not depend on the machine's load. A compile
  refused because the compiler was busy is not remembered: it may succeed later.
- Background: a busy refusal whose compile goes on (`CompilerBusyError.compiling`) is
  followed; its table lands here (and on disk), or its failure is remembered, so that the
  retry its Retry-After asks for finds it.
- First masks: `fetch_first` answers a request that needs no whole table with masks walked
  state by state from the constraint's byte DFA (compiler/grown/lazy_table.py): a LazyTable
  cached by key beside the tables, counted by what it has walked, from a compile of the
  DFA alone, which is kept on disk too. The whole table is compiled only when `fetch` asks
  for it (a request whose budget binds, or that thinks first); once it lands, it answers
  both and the LazyTable is dropped. A whole compile in flight answers `fetch_first` with
  its DFA's LazyTable too.
- Never blocking on a compile: `fetch` answers a memory hit, a cached failure or a disk hit
  at once (reading the file in the caller's thread), and otherwise a Future that the
  compile resolves. So a request whose table is cached never waits behind a compile.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.service.compile_job import abandoned_error
from gclm.compiler.service.disk_cache import DiskCache
from gclm.compiler.whole.tables import CompiledTable
from gclm.errors import CompileLimitError, CompilerBusyError, GclmError

if TYPE_CHECKING:
    from gclm.compiler.grown.lazy_table import LazyTable

log = logging.getLogger("gclm.compiler")

# Part of every key: bump when CompiledTable's layout or the compile semantics change.
FORMAT_VERSION = "gclm-table-1"
# Bytes charged for a negative entry beyond its message: the key, the exception, the node.
_NEGATIVE_OVERHEAD = 1024

# A compile function returns the table, or a Future of it (compiler/service/pool.py's `submit`).
CompileFn = Callable[[Constraint], "CompiledTable | Future[CompiledTable]"]


class FirstMasksSource(Protocol):
    """Where `fetch_first`'s LazyTables come from (compiler/service/first_mask.py's FirstMasks)."""

    def __call__(self, constraint: Constraint) -> Future[LazyTable | None] | None:
        """The LazyTable of `constraint`'s whole compile in flight, the same Future for
        every call during one compile (None in it when there is none to be had), or None
        when no whole compile of it is in flight."""
        ...

    def compile(self, constraint: Constraint) -> Future[CompiledTable | LazyTable | None]:
        """A compile of `constraint`'s byte DFA alone: its LazyTable, or its whole table
        where no LazyTable serves it, or None (then compile the whole table)."""
        ...

    def from_dfa(self, data: bytes) -> Future[LazyTable | None]:
        """The LazyTable of a byte DFA stored on disk (`ByteDfa.to_bytes`), or None when
        the bytes are damaged."""
        ...

    def gauges(self) -> dict[str, float]:
        """Counters for /metrics."""
        ...

    def wait_warm(self, timeout: float | None = None) -> bool:
        """Block until what the source compiles with is loaded (True), or `timeout`."""
        ...


def _first_key(key: str) -> str:
    """Where a constraint's LazyTable is kept, beside its table's `key`."""
    return f"{key}:first"


def cache_key(constraint: Constraint, vocab_fingerprint: str) -> str:
    """sha256 of the canonical constraint, its whitespace option and the vocabulary."""
    h = hashlib.sha256()
    for part in (FORMAT_VERSION, constraint.key_material(), vocab_fingerprint):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    disk_hits: int = 0
    negative_hits: int = 0
    compiles: int = 0
    compile_seconds_total: float = 0.0
    evictions: int = 0


@dataclass(eq=False)
class _Entry:
    table: CompiledTable | LazyTable | None  # None: a negative entry (a LazyTable: first masks)
    error: GclmError | None
    size: int
    created: float


class TableCache:
    """Thread-safe. `fetch(constraint)` never blocks on a compile; `get` waits for it.

    Args:
        compile_fn: a constraint's table, or a Future of it.
        vocab_fingerprint: part of every key.
        max_bytes: the memory budget for everything cached here.
        disk_dir: where tables are kept across restarts (None: nowhere).
        disk_max_bytes: the disk cache's cap.
        measure: bytes a cached table holds (default: `table.nbytes`); called outside the
            lock, at insertion and on later hits, so that it may build what it counts.
        limits_tag: the compile limits, as text: part of a remembered failure's disk key.
        first_masks: LazyTables for `fetch_first` (None: it waits for the table, as `fetch`
            does).
    """

    def __init__(
        self,
        compile_fn: CompileFn,
        vocab_fingerprint: str,
        *,
        max_bytes: int = 512 << 20,
        disk_dir: Path | str | None = None,
        disk_max_bytes: int = 2 << 30,
        negative_ttl_s: float = 600.0,
        negative_max: int = 1024,
        measure: Callable[[CompiledTable], int] | None = None,
        limits_tag: str = "",
        first_masks: FirstMasksSource | None = None,
    ):
        if max_bytes < 0:
            raise ValueError(f"the cache budget must be 0 bytes or more, got {max_bytes}")
        self._compile = compile_fn
        self._fingerprint = vocab_fingerprint
        self.max_bytes = max_bytes
        self.disk = DiskCache(disk_dir, disk_max_bytes) if disk_dir else None
        # Messages are a few hundred bytes: a hundredth of the tables' cap is plenty.
        self.failures = (
            DiskCache(Path(disk_dir) / "failures", max(1, disk_max_bytes // 100), ".txt")
            if disk_dir
            else None
        )
        self._limits_tag = limits_tag
        self.negative_ttl_s = negative_ttl_s
        self.negative_max = negative_max
        self._measure = measure or (lambda table: table.nbytes)
        self.stats = CacheStats()
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._negatives = 0
        self._bytes = 0
        self._inflight: dict[str, Future[CompiledTable]] = {}
        self._background: set[str] = set()  # keys whose compile goes on with nobody waiting
        self._first_masks = first_masks
        # The compile behind each future handed out for a compile in flight, for `abandon`
        # (until the compile ends, or something other than a request's wait depends on it).
        self._sources: dict[Future[Any], Future[Any]] = {}
        # Finishes compiles (disk write, measuring) off the compile pool's thread.
        self._finisher = ThreadPoolExecutor(2, thread_name_prefix="gclm-cache")

    @property
    def disk_dir(self) -> Path | None:
        return self.disk.directory if self.disk else None

    def key(self, constraint: Constraint) -> str:
        return cache_key(constraint, self._fingerprint)

    @property
    def nbytes(self) -> int:
        """Bytes counted against `max_bytes` now."""
        return self._bytes

    def get(self, constraint: Constraint) -> CompiledTable:
        """The table, waiting for its compile. Raises the compile's error."""
        return self.fetch(constraint).result()

    def fetch(self, constraint: Constraint) -> Future[CompiledTable]:
        """A Future of the table: already done for a memory or disk hit or a remembered
        failure, else resolved when the (single-flight) compile ends."""
        key = self.key(constraint)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.table is None:
                if self._refuses(entry):
                    self.stats.negative_hits += 1
                    return _failed(entry.error)  # type: ignore[arg-type]
                self._drop(key)
                entry = None
            if entry is not None:
                self._entries.move_to_end(key)
                self.stats.hits += 1
            else:
                future = self._inflight.get(key)
                if future is not None:
                    return future  # single-flight: wait for the leader's compile
                future = self._inflight[key] = Future()
                self.stats.misses += 1
        if entry is not None:
            self._remeasure(key, entry)
            return _done(entry.table)  # type: ignore[arg-type]
        assert future is not None  # set above whenever there is no entry
        try:
            table = self._load(key)
        except CompileLimitError as e:
            self._fail(key, future, e)
            return future
        if table is not None:
            self._finish(key, future, table)
            return future
        started = time.perf_counter()
        try:
            compiled = self._compile(constraint)
        except BaseException as e:
            self._fail(key, future, e)
            return future
        if isinstance(compiled, Future):
            self._track(future, compiled)
            compiled.add_done_callback(
                lambda f: self._hand_off(self._compiled, key, future, f, started)
            )
        else:
            self._compiled(key, future, _done(compiled), started)
        return future

    def fetch_first(self, constraint: Constraint) -> Future[CompiledTable | LazyTable]:
        """The table where it is known (cached, on disk or compiling), else a LazyTable of
        the constraint's byte DFA: the same masks, walked as generation reaches states (one
        walk for the first mask). A whole compile in flight answers with its DFA's LazyTable
        if that comes first. Single-flight, as `fetch`."""
        if self._first_masks is None:
            return self.fetch(constraint)  # type: ignore[return-value]
        key = self.key(constraint)
        first = _first_key(key)
        pending: Future[CompiledTable | LazyTable] | None = None
        lazy: _Entry | None = None
        with self._lock:
            entry = self._entries.get(key)
            whole = entry is not None and entry.table is not None
            lazy = None if whole else self._entries.get(first)
            # A failure remembered for the table stands, unless a LazyTable was made before
            # it: a whole compile past its CPU limit does not stop generous requests.
            refused = entry is not None and entry.table is None and self._refuses(entry)
            known = whole or (lazy is None and (refused or key in self._inflight))
            if lazy is not None:
                self._entries.move_to_end(first)
                self.stats.hits += 1
            elif not known:
                if first in self._inflight:
                    return self._inflight[first]  # type: ignore[return-value]
                pending = self._inflight[first] = Future()  # type: ignore[assignment]
                self.stats.misses += 1
        if known:
            return self._first_of_whole(constraint)
        if lazy is not None:
            self._remeasure(first, lazy)
            return _done(lazy.table)  # type: ignore[arg-type,return-value]
        assert pending is not None  # claimed above
        try:
            table = self._load(key)
        except CompileLimitError as e:
            self._fail(key, pending, e, first=True)
            return pending
        if table is not None:
            loaded: Future[CompiledTable | LazyTable | None] = Future()
            loaded.set_result(table)
            self._first_compiled(key, pending, loaded, constraint, stored=True)
            return pending
        stored = self.disk.load(first) if self.disk is not None else None
        if stored is not None:  # the byte DFA of a FIRST compile before a restart
            made = self._first_masks.from_dfa(stored)
            made.add_done_callback(
                lambda f: self._hand_off(self._first_stored, key, pending, f, constraint)
            )
            return pending
        self._first_compile(key, pending, constraint)
        return pending

    def _first_compile(
        self, key: str, pending: Future[CompiledTable | LazyTable], constraint: Constraint
    ) -> None:
        compiled = self._first_masks.compile(constraint)  # type: ignore[union-attr]
        self._track(pending, compiled)
        compiled.add_done_callback(
            lambda f: self._hand_off(self._first_compiled, key, pending, f, constraint)
        )

    def _first_stored(
        self,
        key: str,
        pending: Future[CompiledTable | LazyTable],
        made: Future[LazyTable | None],
        constraint: Constraint,
    ) -> None:
        """A LazyTable from disk; a damaged file is dropped and the DFA compiled again."""
        if made.result() is None:
            self.disk.discard(_first_key(key))  # type: ignore[union-attr]
            self._first_compile(key, pending, constraint)
            return
        with self._lock:
            self.stats.disk_hits += 1
        self._first_compiled(key, pending, made, constraint, stored=True)  # type: ignore[arg-type]

    def _refuses(self, entry: _Entry) -> bool:
        """Whether a negative entry still answers: a compile limit for as long as it is
        cached, another failure for `negative_ttl_s`."""
        lasting = isinstance(entry.error, CompileLimitError)
        return lasting or time.monotonic() - entry.created < self.negative_ttl_s

    def _first_of_whole(self, constraint: Constraint) -> Future[CompiledTable | LazyTable]:
        """`fetch`'s answer, or sooner the LazyTable of the whole compile in flight."""
        whole = self.fetch(constraint)
        if whole.done() or self._first_masks is None:
            return whole  # type: ignore[return-value]
        lazy = self._first_masks(constraint)
        if lazy is None:
            return whole  # type: ignore[return-value]
        self.keep(whole)  # its requests are counted on the future made of it, not on it
        return _first_of(lazy, whole)

    def gauges(self) -> dict[str, float]:
        """Memory and disk use, for /metrics. Measures every entry again first: mask rows
        built while decoding count too."""
        with self._lock:
            entries = [(k, e) for k, e in self._entries.items() if e.table is not None]
        for key, entry in entries:
            self._remeasure(key, entry)
        out: dict[str, float] = {
            "table_cache_bytes": self._bytes,
            "table_cache_budget_bytes": self.max_bytes,
            "table_cache_entries": len(self._entries) - self._negatives,
            "table_cache_negative_entries": self._negatives,
            "table_cache_evictions": self.stats.evictions,
        }
        if self._first_masks is not None:
            out.update(self._first_masks.gauges())
        if self.disk is not None:
            out.update(
                table_disk_bytes=self.disk.nbytes,
                table_disk_budget_bytes=self.disk.max_bytes,
                table_disk_files=self.disk.files,
                table_disk_evictions=self.disk.evictions,
            )
        return out

    def _track(self, future: Future[Any], source: Future[Any]) -> None:
        """Remember `source` as what `future` waits for, until it ends (`abandon`)."""
        with self._lock:
            self._sources[future] = source
        source.add_done_callback(lambda f: self.keep(future))

    def keep(self, future: Future[Any]) -> None:
        """Never cancel the compile behind `future` (one of `fetch`'s): something besides
        the requests counted on it depends on it (a start-up precompile, a request told to
        retry, a LazyTable or a first compile's fallback that waits for it)."""
        with self._lock:
            self._sources.pop(future, None)

    def abandon(self, future: Future[Any]) -> bool:
        """Every request that waited for `future` (one of `fetch`'s or `fetch_first`'s for
        a compile in flight) left before it was answered: cancel the compile behind it. The
        pool stops it, queued or running, unless it answered a request 429 for it (that
        client is to retry); `future` then fails busy, not remembered. A request that joined
        meanwhile gets that 429 and its retry compiles again. False: nothing was cancelled
        (the compile ended, or is not one this cache started)."""
        with self._lock:
            source = self._sources.pop(future, None)
        return source is not None and source.cancel()

    def wait_warm(self, timeout: float | None = None) -> bool:
        """Block until the first masks' compiled functions are loaded (True: so they are,
        or this cache grows none), or `timeout` (see `FirstMasks.wait_warm`)."""
        if self._first_masks is None:
            return True
        return self._first_masks.wait_warm(timeout)

    def close(self) -> None:
        self._finisher.shutdown(wait=False, cancel_futures=True)

    def _hand_off(self, fn: Any, *args: Any) -> None:
        """Run `fn(*args)` on the finisher thread; once the cache is closed (the server is
        shutting down), a compile that ends is dropped instead of raising in its callback."""
        try:
            self._finisher.submit(fn, *args)
        except RuntimeError:  # submitted after shutdown
            log.debug("a compile ended after the table cache closed; dropped")

    # --- filling the cache ---

    def _first_compiled(
        self,
        key: str,
        pending: Future[CompiledTable | LazyTable],
        compiled: Future[CompiledTable | LazyTable | None],
        constraint: Constraint,
        *,
        stored: bool = False,
    ) -> None:
        """A FIRST compile (or a disk hit, `stored`) ended: keep what it made, answer
        `pending`."""
        try:
            result = compiled.result()
        except BaseException as e:
            self._fail(key, pending, e, first=True)
            return
        if result is None:  # no LazyTable after all: the whole table answers
            with self._lock:
                del self._inflight[_first_key(key)]
            whole = self.fetch(constraint)
            self.keep(whole)  # `pending`'s requests wait for it
            whole.add_done_callback(lambda f: copy_outcome(f, pending))
            return
        try:
            self._land_first(key, result, stored=stored)
        except BaseException as e:  # measuring builds mask rows: a bad table fails here
            self._fail(key, pending, e, first=True)
            return
        with self._lock:
            del self._inflight[_first_key(key)]
        pending.set_result(result)

    def _land_first(self, key: str, result: CompiledTable | LazyTable, *, stored: bool) -> None:
        """Keep a FIRST compile's LazyTable, or the whole table it made instead."""
        if not isinstance(result, CompiledTable):
            data = result.stored_dfa()
            if not stored and self.disk is not None and data is not None:
                self.disk.store(_first_key(key), data)
            with self._lock:
                self._keep_first(key, result)
            return
        if not stored:
            self._store_table(key, result)
        size = self._measure(result)
        with self._lock:
            if not stored:
                self.stats.compiles += 1
                self.stats.compile_seconds_total += result.compile_seconds
            self._keep(key, result, size)

    def _first_landed(self, key: str, compiled: Future[CompiledTable | LazyTable | None]) -> None:
        """A FIRST compile went on past its requests' deadline and ended: keep its outcome
        for the retry the 429 asked for."""
        try:
            result = compiled.result()
            if result is not None:
                self._land_first(key, result, stored=False)
        except BaseException as e:
            with self._lock:
                if key not in self._entries:
                    self._remember(key, e)
        finally:
            with self._lock:
                self._background.discard(_first_key(key))

    def _keep_first(self, key: str, lazy: LazyTable) -> None:
        """Cache a LazyTable (with the lock held), unless its table is cached already."""
        entry = self._entries.get(key)
        if entry is None or entry.table is None:  # none, or a failure of the whole compile
            size = lazy.nbytes
            if size <= self.max_bytes:
                self._put(_first_key(key), _Entry(lazy, None, size, time.monotonic()))

    def _load(self, key: str) -> CompiledTable | None:
        """The table from disk; raises a CompileLimitError remembered there."""
        if self.disk is None:
            return None
        data = self.disk.load(key)
        if data is None:
            self._load_failure(key)
            return None
        try:
            table = CompiledTable.from_bytes(data)
        except (ValueError, KeyError, OSError) as e:  # a damaged file: compile again
            log.warning("ignoring damaged cache file for %s (%s); compiling again", key, e)
            self.disk.discard(key)
            return None
        with self._lock:
            self.stats.disk_hits += 1
        return table

    def _compiled(
        self, key: str, future: Future[CompiledTable], compiled: Future, started: float
    ) -> None:
        try:
            table = compiled.result()
        except BaseException as e:
            self._fail(key, future, e)
            return
        with self._lock:
            self.stats.compiles += 1
            self.stats.compile_seconds_total += time.perf_counter() - started
        self._store_table(key, table)
        self._finish(key, future, table)

    def _finish(self, key: str, future: Future[CompiledTable], table: CompiledTable) -> None:
        try:
            size = self._measure(table)
        except BaseException as e:  # measuring builds mask rows: a bad table fails here
            self._fail(key, future, e)
            return
        with self._lock:
            self._keep(key, table, size)
            del self._inflight[key]
        future.set_result(table)

    def _fail(
        self, key: str, future: Future[Any], error: BaseException, *, first: bool = False
    ) -> None:
        """A compile failed (`first`: a FIRST compile, remembered as the table's failure too:
        the whole compile would fail the same way); a busy one that goes on in the
        background is followed, so that its table, LazyTable or failure is kept."""
        if isinstance(error, CancelledError):  # `abandon`: every request left
            error = abandoned_error()
        compiling = error.compiling if isinstance(error, CompilerBusyError) else None
        flight = _first_key(key) if first else key
        with self._lock:
            self._remember(key, error)
            del self._inflight[flight]
            follow = compiling is not None and flight not in self._background
            if follow:
                self._background.add(flight)
        if follow:
            compiling.add_done_callback(  # type: ignore[union-attr]
                lambda f: (
                    self._hand_off(self._first_landed, key, f) if first else self._land(key, f)
                )
            )
        future.set_exception(error)

    def _land(self, key: str, compiled: Future[CompiledTable]) -> None:
        """A background compile ended. Until its table is measured and kept (seconds for a
        large one on a loaded machine), a request for it waits for that, as for any compile
        in flight, instead of starting the compile again: a retry sent at the 429's
        Retry-After arrives just then."""
        with self._lock:
            landing: Future[CompiledTable] | None = None
            if key not in self._inflight:  # else a request that joined the compile keeps it
                landing = self._inflight[key] = Future()
        self._hand_off(self._landed, key, compiled, landing)

    def _landed(
        self, key: str, compiled: Future[CompiledTable], landing: Future[CompiledTable] | None
    ) -> None:
        """Keep a background compile's table or its failure, then answer `landing`."""
        outcome: object
        try:
            table = compiled.result()
            size = self._measure(table)
        except BaseException as e:
            outcome = e
            with self._lock:
                self._background.discard(key)
                if key not in self._entries:  # a retry that joined it may have stored it
                    self._remember(key, e)
        else:
            outcome = table
            self._store_table(key, table)
            with self._lock:
                self._background.discard(key)
                self.stats.compiles += 1
                self._keep(key, table, size)
        if landing is not None:
            with self._lock:
                if self._inflight.get(key) is landing:
                    del self._inflight[key]
            if isinstance(outcome, BaseException):
                landing.set_exception(outcome)
            else:
                landing.set_result(outcome)

    def _store_table(self, key: str, table: CompiledTable) -> None:
        """Write a whole table to disk (if the cache has one), and remove the schema's DFA
        file: the table answers first masks too, and is looked up first."""
        if self.disk is not None:
            self.disk.store(key, table.to_bytes())
            self.disk.discard(_first_key(key))

    def _keep(self, key: str, table: CompiledTable, size: int) -> None:
        """Cache a table (with the lock held); it answers first masks too from now on."""
        self._drop(_first_key(key))
        if size <= self.max_bytes:  # larger than the whole budget: serve it, keep none
            self._put(key, _Entry(table, None, size, time.monotonic()))

    def _remember(self, key: str, error: BaseException) -> None:
        """Cache a failure (with the lock held); busy refusals and bugs are not kept."""
        if isinstance(error, GclmError) and not isinstance(error, CompilerBusyError):
            size = len(error.message) + len(key) + _NEGATIVE_OVERHEAD
            self._put(key, _Entry(None, error, size, time.monotonic()))
            self._negatives += 1
            self._trim_negatives()
            if isinstance(error, CompileLimitError) and self.failures is not None:
                self.failures.store(self._failure_key(key), error.message.encode())

    def _failure_key(self, key: str) -> str:
        return hashlib.sha256(f"{key}\0{self._limits_tag}".encode()).hexdigest()

    def _load_failure(self, key: str) -> None:
        if self.failures is None:
            return
        data = self.failures.load(self._failure_key(key))
        if data is not None:
            raise CompileLimitError(data.decode(errors="replace"))

    # --- the LRU (called with the lock held) ---

    def _put(self, key: str, entry: _Entry) -> None:
        self._drop(key)
        self._entries[key] = entry
        self._bytes += entry.size
        self._evict()

    def _drop(self, key: str) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old.size
            self._negatives -= old.table is None

    def _evict(self) -> None:
        while self._bytes > self.max_bytes and self._entries:
            self._drop(next(iter(self._entries)))
            self.stats.evictions += 1

    def _trim_negatives(self) -> None:
        if self._negatives <= self.negative_max:
            return
        for key in [k for k, e in self._entries.items() if e.table is None]:
            self._drop(key)
            if self._negatives <= self.negative_max:
                return

    def _remeasure(self, key: str, entry: _Entry) -> None:
        table = entry.table
        size = self._measure(table) if isinstance(table, CompiledTable) else table.nbytes  # type: ignore[union-attr]
        if size == entry.size:
            return
        with self._lock:
            if self._entries.get(key) is entry:
                self._bytes += size - entry.size
                entry.size = size
                self._evict()


def _done(table: CompiledTable) -> Future[CompiledTable]:
    future: Future[CompiledTable] = Future()
    future.set_result(table)
    return future


def _failed(error: BaseException) -> Future[CompiledTable]:
    future: Future[CompiledTable] = Future()
    future.set_exception(error)
    return future


def copy_outcome(source: Future[Any], target: Future[Any]) -> None:
    """`source`'s result or exception, into `target`."""
    try:
        target.set_result(source.result())
    except BaseException as e:
        target.set_exception(e)


def _first_of(
    lazy: Future[LazyTable | None], whole: Future[CompiledTable]
) -> Future[CompiledTable | LazyTable]:
    """The LazyTable if it comes before the table, else the table (or its error)."""
    out: Future[CompiledTable | LazyTable] = Future()

    def settle(source: Future) -> None:
        try:
            result = source.result()
        except BaseException as e:
            if source is lazy:  # no masks ahead of the table: wait for it
                return
            outcome: object = e
        else:
            if result is None:  # no LazyTable for this constraint
                return
            if source is lazy and result.compiled is None:
                result.compiled = whole  # the compile it stands in for (its cost: serving.py)
            outcome = result
        try:
            if isinstance(outcome, BaseException):
                out.set_exception(outcome)
            else:
                out.set_result(outcome)  # type: ignore[arg-type]
        except InvalidStateError:  # the other came first
            pass

    lazy.add_done_callback(settle)
    whole.add_done_callback(settle)
    return out
