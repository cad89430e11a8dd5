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
- Single-flight: concurrent requests for one new constraint wait on one compile. One flight
  table (`_flights`) holds every compile in flight, a table's and a FIRST compile's alike:
  the answer its requests share, the compile behind it (what `abandon` stops), and whether
  it goes on in the background.
- Negative: a constraint that failed fails again at once, for `negative_ttl_s`; one that
  ran past a compile limit (CPU seconds, memory, states: a CompileLimitError) for as long
  as it is cached, since those limits do not depend on the machine's load. A compile
  refused because the compiler was busy is not remembered: it may succeed later.
- Background: a busy refusal whose compile goes on (the `outcome` of the pool's
  `Compiling` answer: compiler/service/compile_job.py) is followed; its table lands here
  (and on disk), or its failure is remembered, so that the retry its Retry-After asks for
  finds it.
- Stand-ins: a table may have a stand-in, kept under `first_key(key)` in the same LRU and
  flown in the same flight table, until the table lands and it is dropped: the LazyTable
  of compiler/service/first_tables.py, which decides what a stand-in is, where it comes
  from, and when the table answers instead (`find_stand_in` and the methods after it).
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
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.service.compile_job import Compiling, abandoned_error, settle
from gclm.compiler.service.disk_cache import DiskCache
from gclm.compiler.whole.tables import CompiledTable
from gclm.errors import CompileLimitError, CompilerBusyError, GclmError

if TYPE_CHECKING:
    from gclm.compiler.service.first_mask import FirstMasksSource

log = logging.getLogger("gclm.compiler")

# Part of every key: bump when CompiledTable's layout or the compile semantics change.
FORMAT_VERSION = "gclm-table-1"
# Bytes charged for a negative entry beyond its message: the key, the exception, the node.
_NEGATIVE_OVERHEAD = 1024

# A compile function returns the table, or a Future of it (compiler/service/pool.py's
# `submit`: a Compiling, whose outcome a busy answer's compile goes on to).
CompileFn = Callable[[Constraint], "CompiledTable | Future[CompiledTable]"]


class Sized(Protocol):
    """What the cache keeps: a table, or a stand-in for one."""

    @property
    def nbytes(self) -> int: ...


def first_key(key: str) -> str:
    """Where a stand-in for `key`'s table is kept (a LazyTable: first_tables.py)."""
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
    table: Sized | None  # None: a negative entry (under `first_key`: a stand-in)
    error: GclmError | None
    size: int
    created: float


@dataclass(eq=False)
class _Flight:
    """One key's compile in flight (a table's, or a stand-in's under `first_key`)."""

    # What the requests that joined it wait for; None once they were answered 429 while
    # the compile goes on (a retry then asks the compiler again, and joins its compile).
    answer: Compiling[Any] | None
    # The compile behind `answer`, which `abandon` stops, until it ends or something besides
    # the requests depends on it (`keep`).
    source: Future[Any] | None = None
    background: bool = False  # its compile is followed past its requests' answer

    @property
    def idle(self) -> bool:
        return self.answer is None and not self.background


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
        first_masks: where the engine's first tables (compiler/service/first_tables.py)
            get their LazyTables; carried for it, never called here (None: whole tables
            only).
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
        self._flights: dict[str, _Flight] = {}
        self.first_masks = first_masks
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

    def fetch(self, constraint: Constraint) -> Compiling[CompiledTable]:
        """A Future of the table: already done for a memory or disk hit or a remembered
        failure, else resolved when the (single-flight) compile ends."""
        key = self.key(constraint)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.table is None:
                if self._refuses(entry):
                    self.stats.negative_hits += 1
                    return Compiling.ended(entry.error)
                self._drop(key)
                entry = None
            if entry is not None:
                self._entries.move_to_end(key)
                self.stats.hits += 1
            else:
                answer, claimed = self._claim(key)
                if not claimed:
                    return answer  # single-flight: wait for the leader's compile
                self.stats.misses += 1
        if entry is not None:
            self._remeasure(key, entry)
            return Compiling.ended(entry.table)
        try:
            table = self.load_table(key)
        except CompileLimitError as e:
            self.fail(key, e)
            return answer
        if table is not None:
            self._finish(key, table)
            return answer
        started = time.perf_counter()
        try:
            compiled = self._compile(constraint)
        except BaseException as e:
            self.fail(key, e)
            return answer
        if isinstance(compiled, Future):
            self.fly(key, compiled, lambda f: self._compiled(key, f, started))
        else:
            self._compiled(key, Compiling.ended(compiled), started)
        return answer

    def _refuses(self, entry: _Entry) -> bool:
        """Whether a negative entry still answers: a compile limit for as long as it is
        cached, another failure for `negative_ttl_s`."""
        lasting = isinstance(entry.error, CompileLimitError)
        return lasting or time.monotonic() - entry.created < self.negative_ttl_s

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
        if self.disk is not None:
            out.update(
                table_disk_bytes=self.disk.nbytes,
                table_disk_budget_bytes=self.disk.max_bytes,
                table_disk_files=self.disk.files,
                table_disk_evictions=self.disk.evictions,
            )
        return out

    def keep(self, future: Future[Any]) -> None:
        """Never cancel the compile behind `future` (one of `fetch`'s): something besides
        the requests counted on it depends on it (a start-up precompile, a request told to
        retry, a stand-in or a stand-in's fallback that waits for it)."""
        with self._lock:
            flight = self._flight_of(future)
            if flight is not None:
                flight.source = None

    def abandon(self, future: Future[Any]) -> bool:
        """Every request that waited for `future` (an answer of `fetch`, or of a stand-in's
        flight, for a compile in flight) left before it was answered: cancel the compile
        behind it. The pool stops it, queued or running, unless it answered a request 429
        for it (that client is to retry); `future` then fails busy, not remembered. A
        request that joined meanwhile gets that 429 and its retry compiles again. False:
        nothing was cancelled (the compile ended, or is not one this cache started)."""
        with self._lock:
            flight = self._flight_of(future)
            source = None if flight is None else flight.source
            if flight is not None:
                flight.source = None
        return source is not None and source.cancel()

    def close(self) -> None:
        self._finisher.shutdown(wait=False, cancel_futures=True)

    def hand_off(self, fn: Callable[..., None], *args: Any) -> None:
        """Run `fn(*args)` on the finisher thread; once the cache is closed (the server is
        shutting down), a compile that ends is dropped instead of raising in its callback."""
        try:
            self._finisher.submit(fn, *args)
        except RuntimeError:  # submitted after shutdown
            log.debug("a compile ended after the table cache closed; dropped")

    # --- the flight table ---

    def _claim(self, key: str) -> tuple[Compiling[Any], bool]:
        """The answer of `key`'s compile in flight (False: join it), or a new one that the
        caller is to compile for (True). With the lock held."""
        flight = self._flights.get(key)
        if flight is not None and flight.answer is not None:
            return flight.answer, False
        answer: Compiling[Any] = Compiling()
        if flight is None:
            self._flights[key] = _Flight(answer)
        else:  # its compile goes on in the background: a retry asks the compiler again
            flight.answer = answer
        return answer, True

    def _flying(self, key: str) -> bool:
        """Whether requests wait for `key`'s compile now (with the lock held)."""
        flight = self._flights.get(key)
        return flight is not None and flight.answer is not None

    def _flight_of(self, answer: Future[Any]) -> _Flight | None:
        """The flight whose requests wait for `answer` (with the lock held)."""
        for flight in self._flights.values():
            if flight.answer is answer:
                return flight
        return None

    def fly(self, key: str, compiled: Future[Any], ended: Callable[[Future[Any]], None]) -> None:
        """`key`'s answer waits for `compiled`: `abandon` may stop it until it ends, its
        outcome is the compile's, and `ended(compiled)` runs on the finisher thread."""
        with self._lock:
            flight = self._flights[key]
            answer = flight.answer
            flight.source = compiled
        assert answer is not None  # claimed by the caller
        if isinstance(compiled, Compiling):
            answer.follow(compiled.outcome)

        def done(f: Future[Any]) -> None:
            with self._lock:
                if flight.answer is answer:
                    flight.source = None
            self.hand_off(ended, f)

        compiled.add_done_callback(done)

    def _answered(self, key: str) -> Compiling[Any]:
        """Take `key`'s answer from its flight (with the lock held): its requests are
        answered now."""
        flight = self._flights[key]
        answer = flight.answer
        assert answer is not None, f"no requests wait for {key}"
        flight.answer = flight.source = None
        if flight.idle:
            del self._flights[key]
        return answer

    def fail(
        self,
        key: str,
        error: BaseException,
        compiled: Future[Any] | None = None,
        *,
        remember: str | None = None,
        landed: Callable[[str, Future[Any]], None] | None = None,
    ) -> None:
        """`key`'s compile failed: remember it (as `remember`'s failure: a stand-in's is
        the table's too, the whole compile would fail the same way) and answer its requests.
        A busy refusal whose compile goes on (`compiled`'s outcome) is followed in the
        background, so that its table or failure is kept: a stand-in's by `landed(remember,
        outcome)` on the finisher thread, which ends with `landed_later`."""
        abandoned = isinstance(error, CancelledError)  # `abandon`: every request left
        if abandoned:
            error = abandoned_error()
        goes_on = (
            not abandoned  # the pool stops it
            and isinstance(error, CompilerBusyError)
            and isinstance(compiled, Compiling)
            and not _busy(compiled.outcome)
        )
        follow = False
        with self._lock:
            self._remember(remember or key, error)
            answer = self._answered(key)
            if goes_on:
                flight = self._flights.setdefault(key, _Flight(None))
                follow, flight.background = not flight.background, True
        if follow and isinstance(compiled, Compiling):
            outcome = compiled.outcome
            if landed is not None and remember is not None:  # a stand-in: no retry waits
                outcome.add_done_callback(lambda f: self.hand_off(landed, remember, f))
            else:
                outcome.add_done_callback(lambda f: self._land(key, f))
        if goes_on:
            settle(answer, error)  # its outcome is the compile's
        else:
            answer.end(error)

    def landed_later(self, key: str, table_key: str, error: BaseException | None) -> None:
        """A stand-in's compile that went on in the background ended (`fail`'s `landed`):
        its flight is over, and its `error` is remembered for the table unless the table
        was kept meanwhile."""
        with self._lock:
            if error is not None and table_key not in self._entries:
                self._remember(table_key, error)
            self._background_done(key)

    def _background_done(self, key: str) -> None:
        """`key`'s background compile landed (with the lock held)."""
        flight = self._flights.get(key)
        if flight is not None:
            flight.background = False
            if flight.idle:
                del self._flights[key]

    # --- stand-ins (compiler/service/first_tables.py) ---

    def find_stand_in(self, key: str, alias: str) -> tuple[str, Compiling[Any]]:
        """Where a request that may start on a stand-in (kept under `alias`) for `key`'s
        table stands, in one look under the lock:
        - "table": the table is known (cached, refused, or compiling): `fetch` it;
        - "hit": a stand-in is cached (the answer is done);
        - "joined": its stand-in is in flight: wait for the answer;
        - "claimed": nothing is known: the caller makes the stand-in (`fly`, or `fail`, or
          `take_answer` and then answers it).
        A failure remembered for the table stands, unless a stand-in was made before it:
        a whole compile past its CPU limit does not stop generous requests."""
        with self._lock:
            entry = self._entries.get(key)
            whole = entry is not None and entry.table is not None
            stand_in = None if whole else self._entries.get(alias)
            refused = entry is not None and entry.table is None and self._refuses(entry)
            if whole or (stand_in is None and (refused or self._flying(key))):
                return "table", Compiling.ended(None)
            if stand_in is None:
                answer, claimed = self._claim(alias)
                if claimed:
                    self.stats.misses += 1
                return ("claimed" if claimed else "joined"), answer
            self._entries.move_to_end(alias)
            self.stats.hits += 1
        self._remeasure(alias, stand_in)
        return "hit", Compiling.ended(stand_in.table)

    def take_answer(self, key: str) -> Compiling[Any]:
        """The answer of `key`'s flight, taken from it: the caller answers its requests."""
        with self._lock:
            return self._answered(key)

    def keep_stand_in(self, key: str, alias: str, stand_in: Sized, size: int) -> None:
        """Cache `stand_in` for `key`'s table under `alias`, unless the table is cached."""
        with self._lock:
            entry = self._entries.get(key)
            if (entry is None or entry.table is None) and size <= self.max_bytes:
                self._put(alias, _Entry(stand_in, None, size, time.monotonic()))

    def keep_table(self, key: str, table: CompiledTable, *, stored: bool) -> None:
        """Cache a table a stand-in's compile made instead (written to disk unless it came
        from there, `stored`); its stand-in is dropped. Raises what measuring it raises."""
        if not stored:
            self._store_table(key, table)
        size = self._measure(table)
        with self._lock:
            if not stored:
                self.stats.compiles += 1
                self.stats.compile_seconds_total += table.compile_seconds
            self._keep(key, table, size)

    def count_disk_hit(self) -> None:
        with self._lock:
            self.stats.disk_hits += 1

    # --- filling the cache ---

    def _compiled(self, key: str, compiled: Future[CompiledTable], started: float) -> None:
        try:
            table = compiled.result()
        except BaseException as e:
            self.fail(key, e, compiled)
            return
        with self._lock:
            self.stats.compiles += 1
            self.stats.compile_seconds_total += time.perf_counter() - started
        self._store_table(key, table)
        self._finish(key, table)

    def _finish(self, key: str, table: CompiledTable) -> None:
        try:
            size = self._measure(table)
        except BaseException as e:  # measuring builds mask rows: a bad table fails here
            self.fail(key, e)
            return
        with self._lock:
            self._keep(key, table, size)
            answer = self._answered(key)
        answer.end(table)

    def load_table(self, key: str) -> CompiledTable | None:
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

    def _land(self, key: str, compiled: Future[CompiledTable]) -> None:
        """A background compile ended. Until its table is measured and kept (seconds for a
        large one on a loaded machine), a request for it waits for that, as for any compile
        in flight, instead of starting the compile again: a retry sent at the 429's
        Retry-After arrives just then."""
        with self._lock:
            landing: Compiling[Any] | None = None
            if not self._flying(key):  # else a request that joined the compile keeps it
                landing, _ = self._claim(key)
        self.hand_off(self._landed, key, compiled, landing)

    def _landed(
        self, key: str, compiled: Future[CompiledTable], landing: Compiling[Any] | None
    ) -> None:
        """Keep a background compile's table or its failure, then answer `landing`."""
        outcome: object
        try:
            table = compiled.result()
            size = self._measure(table)
        except BaseException as e:
            outcome = e
            with self._lock:
                self._background_done(key)
                if key not in self._entries:  # a retry that joined it may have stored it
                    self._remember(key, e)
        else:
            outcome = table
            self._store_table(key, table)
            with self._lock:
                self._background_done(key)
                self.stats.compiles += 1
                self._keep(key, table, size)
        if landing is not None:
            with self._lock:
                flight = self._flights.get(key)
                if flight is not None and flight.answer is landing:
                    self._answered(key)
            landing.end(outcome)

    def _store_table(self, key: str, table: CompiledTable) -> None:
        """Write a whole table to disk (if the cache has one), and remove the schema's DFA
        file: the table answers first masks too, and is looked up first."""
        if self.disk is not None:
            self.disk.store(key, table.to_bytes())
            self.disk.discard(first_key(key))

    def _keep(self, key: str, table: CompiledTable, size: int) -> None:
        """Cache a table (with the lock held); it answers first masks too from now on."""
        self._drop(first_key(key))
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
        if table is None:
            return
        size = self._measure(table) if isinstance(table, CompiledTable) else table.nbytes
        if size == entry.size:
            return
        with self._lock:
            if self._entries.get(key) is entry:
                self._bytes += size - entry.size
                entry.size = size
                self._evict()


def _busy(outcome: Future[Any]) -> bool:
    """Whether a compile's outcome is already a busy refusal: nothing goes on behind it (a
    full queue, a server shutting down)."""
    return (
        outcome.done()
        and not outcome.cancelled()
        and isinstance(outcome.exception(), CompilerBusyError)
    )
