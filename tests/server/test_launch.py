"""Start-up: the common constraints compile in the background; the start-up heap is frozen."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading

from gclm.compiler.front.constraint import Constraint
from gclm.server.launch import (
    COMMON_CONSTRAINTS,
    build_compiler,
    freeze_startup_heap,
    no_hugepage_advice,
    wait_for_compiler,
)
from gclm.server.settings import ServerSettings


def test_json_object_is_compiled_at_start_up_without_blocking(embedded_vocab, tmp_path):
    settings = ServerSettings(cache_dir=tmp_path, compile_workers=1, compile_timeout=600)
    pool, cache = build_compiler(settings, embedded_vocab)
    try:
        assert Constraint.json_object() in COMMON_CONSTRAINTS
        # Started before any request, without waiting for it; a request now joins it.
        assert pool.gauges()["compile_queue_depth"] + pool.gauges()["compiles_running"] == 1
        table = cache.fetch(Constraint.json_object()).result(timeout=900)
        assert table.shortest_output == "{}"
        assert pool.stats.compiles == 1
        # Remembered on disk: the next start finds it without compiling.
        assert any((tmp_path / "tables").iterdir())
    finally:
        pool.close()
        cache.close()


def test_the_server_serves_once_the_first_masks_functions_are_loaded(
    embedded_vocab, tmp_path, monkeypatch
):
    # On a cold numba cache the warm-up compiles for 45-60 s; a request served meanwhile
    # waited for numba inside its --compile-timeout and got a 429 (a new container's first).
    from gclm.compiler.service import first_mask

    compiling = threading.Event()
    monkeypatch.setattr(first_mask, "warm_up", lambda vocab: compiling.wait(60))
    settings = ServerSettings(cache_dir=tmp_path, compile_workers=1, first_mask="lazy")
    pool, cache = build_compiler(settings, embedded_vocab, first_masks=True)
    try:
        waiting = threading.Thread(target=wait_for_compiler, args=(pool, cache))
        waiting.start()
        assert pool.wait_ready(120)
        waiting.join(1.0)
        assert waiting.is_alive() and not cache.first_masks.wait_warm(0)
        compiling.set()
        waiting.join(10)
        assert not waiting.is_alive() and cache.first_masks.wait_warm(0)
    finally:
        compiling.set()
        pool.close()
        cache.close()


def test_the_start_up_heap_is_left_out_of_later_collections():
    loaded = [[i] for i in range(1000)]  # what start-up made, never garbage
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() >= len(loaded)
        tracked = {id(o) for o in gc.get_objects()}
        assert not any(id(o) in tracked for o in loaded)  # no collection walks them
        later = [1]
        assert gc.is_tracked(later) and id(later) in {id(o) for o in gc.get_objects()}
    finally:
        gc.unfreeze()


def hugepage_advice() -> bool:
    """numpy's switch, read by setting it back to what it was."""
    from numpy._core.multiarray import _set_madvise_hugepage

    was = _set_madvise_hugepage(True)
    _set_madvise_hugepage(was)
    return was


def test_numpy_stops_advising_huge_pages_here_and_in_child_processes(monkeypatch):
    monkeypatch.setenv("NUMPY_MADVISE_HUGEPAGE", "")  # restored after the test, then
    monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE")  # unset for it
    was = hugepage_advice()
    try:
        no_hugepage_advice()
        assert hugepage_advice() is False
        # A compile worker is a new interpreter: numpy reads the variable at its import.
        code = "from numpy._core.multiarray import _set_madvise_hugepage as s; print(s(False))"
        child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert child.stdout.strip() == "False", child.stderr
    finally:
        from numpy._core.multiarray import _set_madvise_hugepage

        _set_madvise_hugepage(was)


def test_a_user_who_asks_for_huge_pages_keeps_them(monkeypatch):
    from numpy._core.multiarray import _set_madvise_hugepage

    monkeypatch.setenv("NUMPY_MADVISE_HUGEPAGE", "1")
    was = _set_madvise_hugepage(True)
    try:
        no_hugepage_advice()
        assert hugepage_advice() is True
    finally:
        _set_madvise_hugepage(was)
