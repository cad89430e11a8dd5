"""The disk cache: atomic files, a cap in bytes, least recently used out first."""

from __future__ import annotations

import os
import time

import pytest

from gclm.compiler.disk_cache import DiskCache


def test_store_and_load(tmp_path):
    disk = DiskCache(tmp_path, 1000)
    disk.store("k", b"table")
    assert disk.load("k") == b"table" and disk.load("missing") is None
    assert (disk.nbytes, disk.files) == (5, 1)
    assert not list(tmp_path.glob(".tmp-*"))


def test_cap_evicts_the_least_recently_used(tmp_path):
    # The probe: the disk cache was never pruned (713 MB after 3,200 schemas).
    disk = DiskCache(tmp_path, 1000)
    for i in range(3):
        disk.store(f"k{i}", bytes(300))
        os.utime(disk.path(f"k{i}"), (time.time() - 100 + i, time.time() - 100 + i))
    # k0 was oldest, but a hit makes it the most recently used.
    assert disk.load("k0") is not None
    disk.store("k3", bytes(300))
    assert disk.nbytes <= 1000
    assert sum(f.stat().st_size for f in tmp_path.glob("*.npz")) == disk.nbytes
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
