"""Compiled tables, cached once per (constraint, whitespace, vocabulary).

- Memory: an LRU bounded in bytes.
- Disk (optional): one `<key>.npz` per table, written atomically, no pickle; survives restarts.
- Single-flight: concurrent requests for one new constraint wait on one compile.
- Negative: a constraint that failed fails again at once, for `negative_ttl_s`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from gclm.compiler.constraint import Constraint
from gclm.compiler.tables import CompiledTable
from gclm.errors import GclmError

log = logging.getLogger("gclm.compiler")

# Part of every key: bump when CompiledTable's layout or the compile semantics change.
FORMAT_VERSION = "gclm-table-1"


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


class TableCache:
    """Thread-safe. `get(constraint)` returns a table or raises the compile's error."""

    def __init__(
        self,
        compile_fn: Callable[[Constraint], CompiledTable],
        vocab_fingerprint: str,
        *,
        max_bytes: int = 512 << 20,
        disk_dir: Path | str | None = None,
        negative_ttl_s: float = 600.0,
        negative_max: int = 1024,
    ):
        self._compile = compile_fn
        self._fingerprint = vocab_fingerprint
        self.max_bytes = max_bytes
        self.disk_dir = Path(disk_dir) if disk_dir else None
        if self.disk_dir:
            self.disk_dir.mkdir(parents=True, exist_ok=True)
        self.negative_ttl_s = negative_ttl_s
        self.negative_max = negative_max
        self.stats = CacheStats()
        self._lock = threading.Lock()
        self._tables: OrderedDict[str, CompiledTable] = OrderedDict()
        self._bytes = 0
        self._failures: OrderedDict[str, tuple[float, GclmError]] = OrderedDict()
        self._inflight: dict[str, Future[CompiledTable]] = {}

    def key(self, constraint: Constraint) -> str:
        return cache_key(constraint, self._fingerprint)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def get(self, constraint: Constraint) -> CompiledTable:
        key = self.key(constraint)
        with self._lock:
            table = self._tables.get(key)
            if table is not None:
                self._tables.move_to_end(key)
                self.stats.hits += 1
                return table
            failed = self._failures.get(key)
            if failed and time.monotonic() - failed[0] < self.negative_ttl_s:
                self.stats.negative_hits += 1
                raise failed[1]
            future = self._inflight.get(key)
            leader = future is None
            if leader:
                future = self._inflight[key] = Future()
                self.stats.misses += 1
        if not leader:
            return future.result()  # single-flight: wait for the leader's compile
        try:
            table = self._load_or_compile(key, constraint)
        except GclmError as e:
            with self._lock:
                self._failures[key] = (time.monotonic(), e)
                while len(self._failures) > self.negative_max:
                    self._failures.popitem(last=False)
                del self._inflight[key]
            future.set_exception(e)
            raise
        except BaseException as e:
            with self._lock:
                del self._inflight[key]
            future.set_exception(e)
            raise
        with self._lock:
            self._insert(key, table)
            del self._inflight[key]
        future.set_result(table)
        return table

    def _load_or_compile(self, key: str, constraint: Constraint) -> CompiledTable:
        path = self.disk_dir / f"{key}.npz" if self.disk_dir else None
        if path and path.exists():
            try:
                table = CompiledTable.from_bytes(path.read_bytes())
                self.stats.disk_hits += 1
                return table
            except (OSError, ValueError, KeyError) as e:  # a damaged file: compile again
                log.warning("ignoring cache file %s (%s); compiling again", path, e)
        started = time.perf_counter()
        table = self._compile(constraint)
        with self._lock:
            self.stats.compiles += 1
            self.stats.compile_seconds_total += time.perf_counter() - started
        if path:
            self._write(path, table.to_bytes())
        return table

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        try:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".npz")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)  # atomic: readers never see half a file
        except OSError as e:
            log.warning("could not write cache file %s: %s", path, e)

    def _insert(self, key: str, table: CompiledTable) -> None:
        if table.nbytes > self.max_bytes:
            return  # larger than the whole cache: serve it, keep it on disk only
        self._tables[key] = table
        self._bytes += table.nbytes
        while self._bytes > self.max_bytes:
            _, old = self._tables.popitem(last=False)
            self._bytes -= old.nbytes
