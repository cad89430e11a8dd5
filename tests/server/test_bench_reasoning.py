"""bench.reasoning runs (quick): gclm's answers are all valid and complete. It runs on the
session's thinking server (tests/server/e2e_thinking_server.py), the one it would start."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest

from bench import reasoning

pytestmark = pytest.mark.e2e


def test_quick_run_writes_json(tmp_path, thinking_server, monkeypatch) -> None:
    def shared(*, max_batch: int, extra_args: tuple[str, ...]) -> Any:
        """The session's thinking server, where the bench asks for that very server."""
        assert (max_batch, extra_args) == (thinking_server.max_batch, thinking_server.extra_args)
        return contextlib.nullcontext(thinking_server)

    monkeypatch.setattr(reasoning, "GclmServer", shared)
    out = tmp_path / "reasoning.json"
    results = reasoning.main(["--quick", "--json", str(out)])
    assert json.loads(out.read_text()) == results
    assert [row["budget"] - results["minimum"] for row in results["rows"]] == [0, 20, 100]
    assert results["valid_share"]["gclm"] == 1.0
    for row in results["rows"]:
        assert row["gclm"]["thinking"] >= 3  # the end marker at least
