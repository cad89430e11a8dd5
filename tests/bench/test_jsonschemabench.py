"""bench/jsonschemabench.py: one subset_of for the compile and budget benchmarks."""

from __future__ import annotations

from bench import compile as bench_compile
from bench.budget import run as budget
from bench.jsonschemabench import DEFAULT_DIR, subset_of


def test_subset_of_every_naming_scheme() -> None:
    assert subset_of("Github_easy---o1234.json") == "Github_easy"
    assert subset_of("Synthesized---draft2019_09_valid_allOf_id8_subschema1_not_2.json") == (
        "Synthesized"
    )
    assert subset_of("BFCL_parallel_multiple_12.json") == "BFCL_parallel_multiple"
    # The two benchmarks used to disagree here (JsonSchemaStore_2019 against JsonSchemaStore).
    assert subset_of("JsonSchemaStore_2019_5.json") == "JsonSchemaStore"


def test_both_benchmarks_group_the_corpus_the_same_way() -> None:
    assert budget.subset_of is subset_of and bench_compile.subset_of is subset_of
    assert budget.BENCH_DIR == DEFAULT_DIR == bench_compile.DEFAULT_SCHEMAS
    if DEFAULT_DIR.is_dir():  # every file's subset is a name without "_<digit>"
        subsets = {subset_of(p.name) for p in DEFAULT_DIR.glob("*.json")}
        assert "JsonSchemaStore" in subsets and "BFCL_java" in subsets
