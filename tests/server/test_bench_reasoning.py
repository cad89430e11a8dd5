"""bench.reasoning runs (quick): gclm's answers are all valid and complete."""

from __future__ import annotations

import json

import pytest

from bench import reasoning

pytestmark = pytest.mark.e2e


def test_quick_run_writes_json(tmp_path) -> None:
    out = tmp_path / "reasoning.json"
    results = reasoning.main(["--quick", "--json", str(out)])
    assert json.loads(out.read_text()) == results
    assert [row["budget"] - results["minimum"] for row in results["rows"]] == [0, 20, 100]
    assert results["valid_share"]["gclm"] == 1.0
    for row in results["rows"]:
        assert row["gclm"]["thinking"] >= 3  # the end marker at least
