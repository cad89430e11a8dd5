"""bench/first_mask.py: gclm's first masks, the LazyTable over outlines-core's byte DFA and
over a grown one, side by side on two schemas, written as JSON."""

from __future__ import annotations

import json

from bench.first_mask import main

SCHEMAS = {
    "a_object.json": {
        "schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
        "tests": [{"data": {"n": 12}, "valid": True}],
    },
    "b_digits.json": {
        "schema": {"type": "string", "pattern": "^\\d{3}$"},
        "tests": [{"data": "123", "valid": True}],
    },
}


def test_quick_run_writes_json(tmp_path):
    for name, data in SCHEMAS.items():
        (tmp_path / name).write_text(json.dumps(data))
    out = tmp_path / "out.json"
    result = main(
        ["--schemas", str(tmp_path), "--vocab", "49k", "--engines", "gclm-lazy", "gclm-grown",
         "--steps", "2", "--json", str(out)]
    )  # fmt: skip
    assert json.loads(out.read_text()) == result
    summary = result["vocabs"]["49k"]["summary"]
    assert summary["compiled_by_all"] == 2
    # Both grown: the parser reads what to_regex writes for them (`\d` as [0-9]).
    assert summary["gclm-grown"]["fallbacks"] == 0 and summary["gclm-grown"]["refused"] == 0
    rows = result["vocabs"]["49k"]["rows"]
    assert all(r["gclm-grown_bytes"] > 0 and r["gclm-lazy_bytes"] > 0 for r in rows)
    steps = result["vocabs"]["49k"].get("steps")
    assert steps is None  # step costs are measured at 200k only
