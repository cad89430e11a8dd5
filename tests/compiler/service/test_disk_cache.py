"""The disk cache: atomic files, a cap in bytes, least recently used out first."""

from __future__ import annotations

import os
import time

import pytest

from gclm.compiler.service.disk_cache import DiskCache


def usage(path, data: bytes | None = None) -> int:
    """Bytes `path` takes on disk (written with `data` first, if given)."""
    if data is not None:
        path.write_bytes(data)
    return os.stat(path).st_blocks * 512


def test_store_and_load(tmp_path):
    disk = DiskCache(tmp_path, 1 << 20)
    disk.store("k", b"table")
    assert disk.load("k") == b"table" and disk.load("missing") is None
    assert (disk.nbytes, disk.files) == (usage(disk.path("k")), 1)
    assert not list(tmp_path.glob(".tmp-*"))


def test_cap_evicts_the_least_recently_used(tmp_path):
    # The probe: the disk cache was never pruned (713 MB after 3,200 schemas).
    block = usage(tmp_path / "probe", bytes(300))
    cap = block * 7 // 2  # three files fit, a fourth does not
    disk = DiskCache(tmp_path, cap)
    for i in range(3):
        disk.store(f"k{i}", bytes(300))
        os.utime(disk.path(f"k{i}"), (time.time() - 100 + i, time.time() - 100 + i))
    # k0 was oldest, but a hit makes it the most recently used.
    assert disk.load("k0") is not None
    disk.store("k3", bytes(300))
    assert disk.nbytes <= cap
    assert sum(usage(f) for f in tmp_path.glob("*.npz")) == disk.nbytes
    assert disk.load("k0") is not None and disk.load("k3") is not None
    assert disk.load("k1") is None and disk.evictions >= 1


def test_a_directory_over_the_cap_is_pruned_at_start(tmp_path):
    for i in range(5):
        (tmp_path / f"k{i}.npz").write_bytes(bytes(300))
    disk = DiskCache(tmp_path, 1000)
    assert disk.nbytes <= 1000 and disk.files == len(list(tmp_path.glob("*.npz")))


def test_a_blob_over_the_whole_cap_is_not_written(tmp_path):
    disk = DiskCache(tmp_path, 100)
    disk.store("big", bytes(101))
    assert disk.load("big") is None and disk.files == 0


def test_cap_is_validated(tmp_path):
    with pytest.raises(ValueError, match="at least 1 byte"):
        DiskCache(tmp_path, 0)


def test_the_cap_counts_blocks_on_disk_not_lengths(tmp_path):
    # 100-byte files each fill a whole block (4 KiB on common filesystems): counted by
    # length, 40 of them (4,000 bytes) looked well under a 16 KiB cap.
    cache = DiskCache(tmp_path, max_bytes=16 << 10)
    for i in range(40):
        cache.store(f"k{i}", b"x" * 100)
    on_disk = sum(os.stat(p).st_blocks * 512 for p in tmp_path.glob("*.npz"))
    assert 0 < on_disk <= 16 << 10
    assert cache.nbytes == on_disk
