"""Compiled tables on disk: one `<key>.npz` per table, bounded in bytes, least recently used
out first.

Files are written atomically (a temporary file renamed into place), so a reader never sees
half a table, and a disk hit touches its file's mtime, which is the recency the eviction
reads. Without a cap the directory grew by ~220 KB per distinct schema forever (713 MB
after 3,200 schemas in the probe). The cap counts the blocks a file takes on disk, not its
length: small files each fill whole blocks (a 4 MiB cap counted by length used 6.1 MiB).
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from pathlib import Path

log = logging.getLogger("gclm.compiler")

SUFFIX = ".npz"
# After an eviction the directory is left this far below its cap, so that the next few
# writes do not each trigger one.
_LOW_WATER = 0.9


def disk_usage(stat: os.stat_result) -> int:
    """Bytes a file takes on disk: its blocks (512 bytes each, by POSIX), or its length
    where the platform does not count blocks."""
    blocks = getattr(stat, "st_blocks", None)
    return blocks * 512 if blocks is not None else stat.st_size


class DiskCache:
    """Thread-safe byte blobs by key under `directory`, at most `max_bytes` in all, in
    files named `<key><suffix>`."""

    def __init__(self, directory: Path | str, max_bytes: int, suffix: str = SUFFIX) -> None:
        if max_bytes < 1:
            raise ValueError(f"the disk cache needs a cap of at least 1 byte, got {max_bytes}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.suffix = suffix
        self.evictions = 0
        self._lock = threading.Lock()
        self._sizes: dict[str, int] = {}
        self._bytes = 0
        self._rescan()
        if self._bytes > max_bytes:
            with self._lock:
                self._evict()

    @property
    def nbytes(self) -> int:
        """Bytes the tables take on disk (their blocks), as last counted."""
        return self._bytes

    @property
    def files(self) -> int:
        return len(self._sizes)

    def path(self, key: str) -> Path:
        return self.directory / f"{key}{self.suffix}"

    def load(self, key: str) -> bytes | None:
        """The stored bytes, or None. A hit makes the file the most recently used."""
        path = self.path(key)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        try:
            os.utime(path)
        except OSError:
            pass
        return data

    def store(self, key: str, data: bytes) -> None:
        """Write `data` atomically, then evict the least recently used past the cap.

        A blob larger than the whole cap is not written. Errors are logged, not raised: the
        disk cache only saves compile time.
        """
        if len(data) > self.max_bytes:
            return
        path = self.path(key)
        try:
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=self.suffix)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError as e:
            log.warning("could not write cache file %s: %s", path, e)
            return
        try:
            used = disk_usage(path.stat())
        except OSError:
            used = len(data)
        with self._lock:
            self._bytes += used - self._sizes.get(key, 0)
            self._sizes[key] = used
            if self._bytes > self.max_bytes:
                self._rescan()  # other processes may share the directory: count it again
                self._evict()

    def discard(self, key: str) -> None:
        """Remove a file: a damaged one, or one a newer file supersedes (nothing if none)."""
        with self._lock:
            self._bytes -= self._sizes.pop(key, 0)
        self.path(key).unlink(missing_ok=True)

    def _rescan(self) -> None:
        sizes = {}
        for entry in os.scandir(self.directory):
            name = entry.name
            if not name.endswith(self.suffix) or not entry.is_file():
                continue
            if name.startswith(".tmp-"):
                continue
            try:
                sizes[name[: -len(self.suffix)]] = disk_usage(entry.stat())
            except OSError:
                continue
        self._sizes = sizes
        self._bytes = sum(sizes.values())

    def _evict(self) -> None:
        """Delete the least recently used files until the total is below the low-water mark."""
        by_age = []
        for key in self._sizes:
            try:
                by_age.append((self.path(key).stat().st_mtime, key))
            except OSError:
                by_age.append((0.0, key))
        by_age.sort()
        target = int(self.max_bytes * _LOW_WATER)
        for _, key in by_age:
            if self._bytes <= target:
                break
            self._bytes -= self._sizes.pop(key)
            self.path(key).unlink(missing_ok=True)
            self.evictions += 1
