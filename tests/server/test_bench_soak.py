"""bench/soak.py's workload: distinct schemas really are distinct, and its report renders."""

from __future__ import annotations

from bench.soak import bomb, distinct, markdown
from gclm.compiler.front.constraint import Constraint
from gclm.compiler.service.cache import cache_key


def test_schemas_are_distinct_constraints() -> None:
    keys = {cache_key(Constraint.json_schema(distinct(i)), "v") for i in range(100)}
    keys |= {cache_key(Constraint.json_schema(bomb(i)), "v") for i in range(6)}
    assert len(keys) == 106


def test_markdown_reports_every_sample() -> None:
    sample = {"schemas": 10, "seconds": 1.0, "rss_mb": 900.0, "workers_rss_mb": 300.0}
    result = {
        "machine": {"cpus": 2, "load_before": 1.0, "load_after": 1.0},
        "settings": {
            "cache_memory_mib": 64,
            "cache_disk_mib": 16,
            "compile_timeout_s": 10.0,
            "bombs": 6,
            "schemas": 20,
        },
        "idle_cached_s": 1.0,
        "bombs_cached_s": 1.2,
        "cached_under_bombs_ratio": 1.2,
        "idle_new_schema_s": 1.5,
        "bombs_new_schema_s": 1.9,
        "new_schema_extra_s": 0.4,
        "bomb_statuses": [400] * 6,
        "bombs_answered_within_s": 10.1,
        "soak_refused_400": 20,
        "boot_rss_mb": 880.0,
        "boot_growth_over_budget": 1.1,
        "start_rss_mb": 900.0,
        "peak_rss_mb": 950.0,
        "rss_growth_mb": 50.0,
        "rss_growth_over_budget": 0.78,
        "rss_second_half_spread_mb": 2.0,
        "final_disk_mb": 15.0,
        "server_tracebacks": 0,
        "samples": [
            {**sample, "cache_mb": 30.0, "disk_mb": 5.0},
            {**sample, "schemas": 20, "cache_mb": 60.0, "disk_mb": 15.0},
        ],
    }
    text = markdown(result, "python -m bench.soak --schemas 20")
    assert "| 1.2x |" in text and "+0.4 s" in text
    assert "| 20 | 1.0 | 900.0 | 300.0 | 60.0 | 15.0 |" in text
