"""bench/maskbench.py's pure parts: the split, the serializations, the outcome of a row."""

from __future__ import annotations

import json

from bench.maskbench import by_half, half_of, outcome, select, serializations


def test_split_is_fixed_by_the_name_and_covers_both_halves(tmp_path):
    names = [f"schema_{i}.json" for i in range(40)]
    for name in names:
        (tmp_path / name).write_text("{}")
    halves = {name: half_of(name) for name in names}
    assert set(halves.values()) == {"tune", "report"}
    assert halves == {name: half_of(name) for name in names}  # deterministic
    tune = select(tmp_path, "tune", None, None)
    report = select(tmp_path, "report", None, None)
    assert {p.name for p in tune} | {p.name for p in report} == set(names)
    assert not {p.name for p in tune} & {p.name for p in report}
    assert [p.name for p in select(tmp_path, "all", ["schema_1"], 3)] == [
        p.name for p in select(tmp_path, "all", ["schema_1"], None)
    ][:3]


def test_serializations_are_spaced_then_compact():
    assert serializations({"a": [1, "é"]}) == ['{"a": [1, "é"]}', '{"a":[1,"é"]}']
    assert serializations(5) == ["5"]
    assert all(json.loads(t) == {"a": [1, "é"]} for t in serializations({"a": [1, "é"]}))


def test_outcome_counts_an_accepted_invalid_instance_first():
    assert outcome({"timeout": "compile over 30 s"}) == "timeout"
    assert outcome({"error": "UnsupportedSchemaError: ..."}) == "compile_error"
    assert outcome({"rejected_valid": 1, "accepted_invalid": 1}) == "invalidation_error"
    assert outcome({"rejected_valid": 1, "accepted_invalid": 0}) == "validation_error"
    assert outcome({"rejected_valid": 0, "accepted_invalid": 0}) == "pass"


def test_each_half_is_summarized_apart():
    names = [f"schema_{i}.json" for i in range(12)]
    rows = [
        {
            "file": n,
            "tests": 1,
            "gclm": {"compile_s": 0.5, "rejected_valid": 0, "accepted_invalid": 0},
        }
        for n in names
    ]
    rows[0]["gclm"] = {"error": "UnsupportedSchemaError: ..."}
    halves = by_half(rows, ["gclm"])
    assert set(halves) == {half_of(n) for n in names} == {"tune", "report"}
    for half, summary in halves.items():
        mine = [r for r in rows if half_of(r["file"]) == half]
        assert summary["gclm"]["schemas"] == len(mine)
        assert summary["gclm"]["compile_error"] == (half == half_of(names[0]))
        assert summary["gclm"]["pass"] == len(mine) - summary["gclm"]["compile_error"]
    assert sum(s["gclm"]["schemas"] for s in halves.values()) == len(rows)
