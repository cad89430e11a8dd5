"""bench/budget.py's pure parts on hand-made outputs (no model), and masking/slack.py's
guarantee: the slack penalty never allows a masked token nor removes an allowed one."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bench import budget
from bench import budget_metrics as metrics
from gclm.compiler.tables import build_table
from gclm.masking import ConstraintState, allocate_bitmask, apply_bitmask, fill_bitmask
from gclm.masking.slack import SlackPolicy, slack_penalties, spread_slack

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


# --- the slack policy keeps the mask's guarantee ---


def _chain_table():
    """0 -a-> 1 -b-> 2 (accepting); tokens c and d loop in 0 and 1 ("string content");
    token e in 0 jumps to 2; token f in 0 moves away, to 3 -g-> 1 ("an optional property");
    vocabulary of 40 (two mask words), EOS = 39."""
    edges = [(0, 1, 1), (1, 2, 2), (0, 3, 0), (0, 4, 0), (1, 3, 1), (1, 4, 1), (0, 35, 2)]
    edges += [(0, 6, 3), (3, 7, 1)]
    arr = np.array(edges)
    return build_table(
        vocab_size=40,
        eos_token_id=39,
        initial=0,
        num_states=4,
        accepting=np.array([False, False, True, False]),
        src=arr[:, 0],
        tokens=arr[:, 1],
        dst=arr[:, 2],
    )


def test_slack_penalty_targets_tokens_that_eat_the_reserve():
    table = _chain_table()
    policy = SlackPolicy(reserve=1.0, penalty=2.0)
    # budget 5, min 1: slack 4. In state 0 with 5 left, looping (dist 1) leaves slack 3, and
    # the reserve is 4 * min(1/1 by structure, 4/5 by time) = 3.2: a shortfall of 0.2. Going
    # to 1 (dist 1) is the same; e (dist 0) has no reserve to keep, and f (to dist 2) moves
    # away from acceptance: not lateral, never penalised.
    rows, pens = slack_penalties(table, 0, 5, 5, policy)
    assert np.allclose(sorted(pens.tolist()), [0.4, 0.4])
    penalised = np.concatenate([table.token_sets.tokens_of(r) for r in rows.tolist()])
    assert sorted(penalised.tolist()) == [1, 3, 4]  # a, c, d; not e (35) nor f (6)
    # Two tokens later (3 left, still in state 0) the slack is 1 against 4 * 2/5 = 1.6.
    rows, pens = slack_penalties(table, 0, 3, 5, policy)
    assert np.allclose(sorted(pens.tolist()), [1.2, 1.2])
    assert slack_penalties(table, 0, 5, 5, SlackPolicy(penalty=0.0))[0].size == 0
    assert slack_penalties(table, 0, 1, 1, policy)[0].size == 0  # no slack to spread


@pytest.mark.parametrize("reserve", [0.0, 0.5, 1.0])
def test_slack_penalty_never_changes_the_allowed_set(reserve):
    table = _chain_table()
    policy = SlackPolicy(reserve=reserve, penalty=7.0)
    rng = np.random.default_rng(0)
    for budget_ in range(table.min_tokens, 8):
        for state in range(table.num_states):
            for left in range(max(1, int(table.dist[state])), budget_ + 1):
                seq = ConstraintState(table)
                seq.state = state
                bitmask = allocate_bitmask(1, table.vocab_size)
                fill_bitmask(bitmask, 0, seq, left)
                logits = torch.tensor(rng.normal(size=(1, 48)), dtype=torch.float32)
                apply_bitmask(logits, bitmask)
                allowed = torch.isfinite(logits[0]).clone()
                spread_slack(logits[0], table, state, left, budget_, policy)
                assert torch.equal(torch.isfinite(logits[0]), allowed)
                assert not torch.isnan(logits).any()
                assert allowed.any()


def test_slack_policy_is_validated():
    with pytest.raises(ValueError, match="reserve"):
        SlackPolicy(reserve=1.5)
    with pytest.raises(ValueError, match="penalty"):
        SlackPolicy(penalty=float("inf"))
