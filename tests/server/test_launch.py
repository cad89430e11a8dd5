"""Wiring the compiler at start-up: the common constraints compile in the background."""

from __future__ import annotations

from gclm.compiler.constraint import Constraint
from gclm.server.launch import COMMON_CONSTRAINTS, build_compiler
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
