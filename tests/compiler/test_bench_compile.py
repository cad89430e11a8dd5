"""bench/compile.py's core on three tiny schemas: rows, summary keys, coverage, failures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gclm.compiler.service.worker import CompileLimits
from gclm.compiler.vocab.vocabulary import TokenVocabulary

REPO = Path(__file__).resolve().parents[2]

SCHEMAS = {
    "Tiny_1.json": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    "Tiny---two.json": {"enum": ["x", "yz"]},
    "Broken_3.json": {"type": "nosuchtype"},  # invalid in any JSON Schema draft
}


@pytest.fixture(scope="module")
def bench_compile():
    import bench.compile as module

    return module


@pytest.fixture(scope="module")
def vocab() -> TokenVocabulary:
    """EOS, printable ASCII one byte a token, and a few longer tokens."""
    tokens: list[bytes | None] = [None] + [bytes([b]) for b in range(0x20, 0x7F)]
    tokens += [b'{"', b'":', b'"}', b"yz"]
    return TokenVocabulary(tuple(tokens), 0, "plain")


def test_bench_on_tiny_schemas(bench_compile, vocab, tmp_path):
    for name, schema in SCHEMAS.items():
        (tmp_path / name).write_text(json.dumps({"description": "", "schema": schema}))
    (tmp_path / "README.md").write_text("not a schema")
    paths = bench_compile.find_schemas([str(tmp_path)])
    assert sorted(p.name for p in paths) == sorted(SCHEMAS)

    jobs = [bench_compile.load_job(p) for p in paths]
    result = bench_compile.bench(jobs, vocab, CompileLimits(timeout_s=30.0), split=1)

    rows = {r["file"]: r for r in result["rows"]}
    assert set(rows) == set(SCHEMAS)
    for name in ("Tiny_1.json", "Tiny---two.json"):
        row = rows[name]
        assert row["ok"] and row["error"] is None
        for key in ("a_s", "b_s", "c_s", "ratio", "states", "table_bytes", "table_pct_of_dense"):
            assert row[key] > 0
        assert row["dense_bytes"] == row["states"] * vocab.size * 8
        assert row["all_packed_pct_of_dense"] > 0 and row["runtime_bytes"] > 0
    broken = rows["Broken_3.json"]
    assert not broken["ok"] and broken["reason"].startswith("ConstraintError: Unknown type")

    s = result["summary"]
    assert (s["total"], s["compiled"]) == (3, 2)
    assert s["coverage"] == pytest.approx(2 / 3)
    for key in ("a", "b", "c"):
        assert s[f"{key}_s_p50"] > 0 and s[f"{key}_s_p90"] >= s[f"{key}_s_p50"]
    for key in ("overhead_ratio_p50", "overhead_ratio_of_medians", "table_pct_of_dense_p50"):
        assert s[key] > 0
    assert result["failures"] == [
        {"reason": broken["reason"], "count": 1, "examples": ["Broken_3.json"]}
    ]
    assert result["subsets"] == {
        "Broken": {"total": 1, "compiled": 0, "coverage": 0.0},
        "Tiny": {"total": 2, "compiled": 2, "coverage": 1.0},
    }
    (split,) = result["split"]
    assert split["ok"] and split["index_s"] > 0 and split["blob_bytes"] > 0
    assert "# Compile benchmark" in bench_compile.markdown(result)


def test_failure_reasons_group_by_keyword_and_normalised_message(bench_compile):
    reason = bench_compile.failure_reason
    unsupported = {
        "type": "UnsupportedSchemaError",
        "keyword": "pattern",
        "message": "JSON Schema keyword 'pattern' at /properties/a is not supported: "
        "'^(?=x)' uses look-around. Remove it or rewrite the schema without it.",
    }
    assert reason(unsupported) == "unsupported keyword 'pattern': '…' uses look-around"
    limit = {
        "type": "CompileLimitError",
        "message": "The constraint compiles to 250001 DFA states, over the limit of 200000.",
    }
    assert reason(limit) == (
        "CompileLimitError: The constraint compiles to N DFA states, over the limit of N."
    )
    assert reason({"type": "timeout", "message": "..."}) == "timeout"
    assert bench_compile.subset_of("Github_easy---o123.json") == "Github_easy"
    assert bench_compile.subset_of("BFCL_parallel_multiple_12.json") == "BFCL_parallel_multiple"
