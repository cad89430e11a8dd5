"""bench/budget/run.py's pure parts on hand-made outputs (no model)."""

from __future__ import annotations

import math

from bench.budget import metrics
from bench.budget import run as budget

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "age": {"type": "integer"},
    },
    "required": ["name", "tags", "age"],
}


def _score(text: str, schema=PERSON):
    return metrics.score(text, schema, metrics.validator_for(schema))


# --- parsing ---


def test_strict_parse_takes_the_whole_text_only():
    assert metrics.parse_strict(' {"a": 1} \n') == {"a": 1}
    assert metrics.parse_strict('Sure! {"a": 1}') is metrics.MISSING


def test_extract_takes_the_first_json_value_in_prose_or_a_fence():
    assert metrics.extract_json('Sure! ```json\n{"a": [1]}\n``` done') == {"a": [1]}
    assert metrics.extract_json('{oops} then [1, 2] and {"b": 2}') == [1, 2]
    assert metrics.extract_json("  42 trailing") == 42  # the first non-blank character
    assert metrics.extract_json("no json here") is metrics.MISSING
    assert metrics.extract_json("") is metrics.MISSING


# --- hollow slots and degeneracy ---


def test_hollow_slots_follow_min_length_and_min_items():
    assert metrics.hollow_slots({"name": "", "tags": [""], "age": 3}, PERSON) == [True, True, True]
    assert metrics.hollow_slots({"name": "Al", "tags": ["", ""], "age": 3}, PERSON) == [
        False,
        False,
        True,
        True,
    ]


def test_hollow_slots_resolve_refs_and_combinators():
    schema = {
        "$defs": {"code": {"type": "string", "minLength": 2}},
        "type": "object",
        "properties": {"c": {"$ref": "#/$defs/code"}, "d": {"anyOf": [{"minItems": 2}]}},
        "additionalProperties": {"type": "string", "minLength": 1},
    }
    value = {"c": "ab", "d": [1, 2], "x": "y", "z": "yz"}
    # The object has optional properties: a slot, not hollow since it has some.
    assert metrics.hollow_slots(value, schema) == [False, True, True, True, False]


def test_an_object_of_optional_properties_is_hollow_when_empty():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {}}}
    assert _score("{}", schema).degenerate
    assert _score('{"b": ""}', schema).degenerate  # present but empty
    assert _score('{"b": [], "a": null}', schema).valid is False
    assert not _score('{"a": 1}', schema).degenerate
    assert not _score('{"b": "x"}', schema).degenerate
    required = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert metrics.hollow_slots({"a": 1}, required) == []  # nothing optional: not a slot


def test_score_marks_degenerate_closure():
    s = _score('{"name": "", "tags": [""], "age": 0}')
    assert (s.strict_parse, s.valid, s.degenerate, s.hollow_share) == (True, True, True, 1.0)
    s = _score('{"name": "Ann", "tags": [""], "age": 30}')
    assert (s.valid, s.degenerate) == (True, False)
    assert math.isclose(s.hollow_share, 2 / 3)


def test_score_invalid_and_extracted():
    s = _score('{"name": "Ann"}')  # a required property missing
    assert (s.strict_parse, s.valid, s.valid_extracted, s.degenerate) == (True, False, False, False)
    assert s.hollow_share is None
    s = _score('Here: {"name": "Ann", "tags": ["x"], "age": 3} ok')
    assert (s.strict_parse, s.extracted_parse, s.valid, s.valid_extracted) == (
        False,
        True,
        False,
        True,
    )
    s = _score('{"name": "Ann", "tags": ["x"], "age": 3')  # cut off: the inner ["x"] is found
    assert (s.strict_parse, s.extracted_parse, s.valid_extracted) == (False, True, False)
    s = _score('{"name": "Ann", "age": 3')
    assert (s.strict_parse, s.extracted_parse, s.valid_extracted) == (False, False, False)


def test_score_checks_formats():
    schema = {"type": "string", "format": "email"}
    assert not _score('"not an email"', schema).valid
    assert _score('"a@b.co"', schema).valid


def test_no_slots_is_never_degenerate():
    s = _score("3", {"type": "integer"})
    assert (s.valid, s.degenerate, s.hollow_share) == (True, False, None)


# --- aggregation ---


def _record(arm, level, text, tokens, reason, schema="s"):
    from dataclasses import asdict

    return {
        "arm": arm,
        "level": level,
        "schema": schema,
        "tokens": tokens,
        "finish_reason": reason,
        **asdict(_score(text)),
    }


def test_aggregate_rows_in_arm_and_level_order():
    records = [
        _record("b", "min", '{"name": "", "tags": [""], "age": 0}', 10, "stop"),
        _record("b", "min", '{"name": "Al", "tags": ["x"], "age": 0}', 12, "stop", "t"),
        _record("a", "min", '{"name": "Al", "tags": ["x"]', 16, "length"),
        _record("a", "min", 'ok {"name": "Al", "tags": ["x"], "age": 1}', 20, "stop"),
        _record("a", "16", '{"name": "Al", "tags": ["x"], "age": 1}', 9, "stop"),
    ]
    rows = metrics.aggregate(records, ["a", "b"], ["min", "16"])
    assert [(r["arm"], r["level"], r["n"]) for r in rows] == [
        ("a", "min", 2),
        ("a", "16", 1),
        ("b", "min", 2),
    ]
    a_min, _, b_min = rows
    assert a_min["parse_strict_pct"] == 0.0 and a_min["parse_extracted_pct"] == 100.0
    assert a_min["valid_pct"] == 0.0 and a_min["valid_extracted_pct"] == 50.0
    assert a_min["useful_pct"] == 50.0 and a_min["degenerate_pct"] == 0.0
    assert a_min["mean_tokens"] == 18.0
    assert a_min["finish"] == {"length": 50.0, "stop": 50.0}
    assert b_min["schemas"] == 2 and b_min["valid_pct"] == 100.0
    assert b_min["degenerate_pct"] == 50.0 and b_min["useful_pct"] == 50.0
    assert b_min["hollow_share_pct"] == 66.7  # (1 + 1/3) / 2: ["x"] is at minItems 1


# --- schema sampling and budgets ---


def test_subset_of_file_names():
    assert budget.subset_of("Github_easy---o1234.json") == "Github_easy"
    assert budget.subset_of("BFCL_java_92.json") == "BFCL_java"
    assert budget.subset_of("Glaiveai2K---foo_bar.json") == "Glaiveai2K"


def test_pick_is_deterministic_and_spread_over_subsets():
    names = [f"A---{i}.json" for i in range(10)] + ["B_1.json", "B_2.json", "C---x.json"]
    picked = budget.pick_bench_files(names, 5)
    assert picked == budget.pick_bench_files(list(reversed(names)), 5)
    assert {budget.subset_of(n) for n in picked} == {"A", "B", "C"}
    assert len(set(picked)) == 5
    assert len(budget.pick_bench_files(names, 100)) == len(names)


def test_level_budgets_skip_levels_below_min():
    assert budget.level_budgets(12) == {
        "min": 12,
        "min+2": 14,
        "min+5": 17,
        "16": 16,
        "32": 32,
        "64": 64,
    }
    assert budget.level_budgets(40) == {"min": 40, "min+2": 42, "min+5": 45, "64": 64}


def test_jobs_share_a_budget_between_levels():
    class Table:
        min_tokens = 11

    jobs = budget.make_jobs("s", Table(), [1, 2], [(0.0, 0)])
    by_arm = [j for j in jobs if j.arm == "budget-aware"]
    assert {j.budget: tuple(j.levels) for j in by_arm}[16] == ("min+5", "16")
    assert len(jobs) == 4 * 5


# --- forced cells (bench/budget/forced.py; its own tests are in tests/bench/) ---


def test_aggregate_counts_forced_cells_apart():
    hollow = '{"name": "", "tags": [""], "age": 0}'
    records = [
        {**_record("b", "min", hollow, 10, "stop"), "forced": True},
        {**_record("b", "min", hollow, 10, "stop", "t"), "forced": False},
        {**_record("b", "min", '{"name": "Al", "tags": ["x"], "age": 0}', 12, "stop")},
        # Unknown: counted as not forced, and counted apart.
        {**_record("b", "min", hollow, 10, "stop", "u"), "forced": None},
    ]
    (row,) = metrics.aggregate(records, ["b"], ["min"])
    assert row["degenerate_pct"] == 75.0 and row["forced_pct"] == 25.0
    assert row["forced"] == 1 and row["forced_unknown"] == 1
    assert row["free_degenerate_pct"] == 66.7  # 2 of the 3 cells that are not forced
