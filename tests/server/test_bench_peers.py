"""bench/peers.py's bookkeeping: per-cell figures, validity, and each system's ratio to vllm."""

from __future__ import annotations

import json

from bench.peers import Cell, is_valid, markdown, ratios


def cell(system: str, concurrency: int, tokens: int, wall: float) -> Cell:
    c = Cell(system, concurrency, 96, requests=2, wall_s=wall, completion_tokens=tokens)
    c.latencies = [1.0, 3.0]
    c.valid = 1
    c.finish.update({"stop": 1, "length": 1})
    return c


def test_cell_summary() -> None:
    s = cell("vllm", 8, 100, 2.0).summary()
    assert (s["tok_s"], s["p50_s"], s["p99_s"], s["valid_pct"]) == (50.0, 2.0, 3.0, 50.0)
    assert s["finish"] == {"stop": 1, "length": 1}
    assert (s["req_s"], s["mean_tokens"]) == (1.0, 50.0)


def test_ratios_are_each_system_over_plain_vllm_per_cell() -> None:
    cells = [cell("gclm-vllm", 8, 95, 1.0), cell("vllm", 8, 100, 1.0), cell("gclm", 8, 10, 1.0)]
    cells.append(cell("gclm", 16, 10, 1.0))  # no vllm cell to compare with
    assert ratios(cells) == {
        "gclm-vllm / vllm, budget 96, concurrency 8": 0.95,
        "gclm / vllm, budget 96, concurrency 8": 0.1,
        "gclm / vllm, budget 96, concurrency 16": None,
    }
    text = markdown(
        {
            "command": "python -m bench.peers",
            "machine": {"cpus": 2, "platform": "x", "loadavg_before": (1, 1, 1)},
            "cores": "1",
            "eager": False,
            "per_worker": 6,
            "cells": [c.summary() for c in cells],
            "ratios": ratios(cells),
            "loadavg_after": (1, 1, 1),
        }
    )
    assert "| gclm-vllm | 96 | 8 | 95.0 |" in text
    assert "6 requests per worker and run" in text
    assert "- gclm-vllm / vllm, budget 96, concurrency 8: 0.95" in text


def test_validity_is_the_schema_s() -> None:
    good = {"name": "a", "email": "b", "city": "c", "age": 3, "bio": "d"}
    assert is_valid(json.dumps(good))
    assert not is_valid(json.dumps({**good, "age": -1}))
    assert not is_valid('{"name": "a", "em')
    assert not is_valid(None)
