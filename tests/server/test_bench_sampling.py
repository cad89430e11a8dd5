"""bench.sampling runs (quick) and reports every timing for both batch sizes."""

from __future__ import annotations

import json

import pytest

from bench import sampling

pytestmark = pytest.mark.e2e


def test_quick_run_writes_json(tmp_path) -> None:
    out = tmp_path / "sampling.json"
    results = sampling.main(["--quick", "--json", str(out)])
    assert json.loads(out.read_text()) == results
    assert [c["batch"] for c in results["cases"]] == [1, 8]
    for case in results["cases"]:
        assert all(case[k] > 0 for k in ("m", "s", "p", "l", "hf"))
        assert case["share_of_step"] == pytest.approx((case["p"] + case["l"]) / case["m"])
