"""minProperties/maxProperties over a few optional properties: every allowed choice generated."""

from __future__ import annotations

import itertools

from json_accepts import accepts

from gclm.compiler.front.json_schema.normalize import normalize_schema

# MaskBench Snowplow---sp_353: each input has exactly two of three properties, `placeholder`
# always; {"placeholder": 2, "pojo": {...}} was rejected (`json` had been made required).
INPUT = {
    "type": "object",
    "properties": {
        "json": {"type": "string"},
        "placeholder": {"type": "integer"},
        "pojo": {"type": "object", "properties": {"field": {"type": "string"}}},
    },
    "required": ["placeholder"],
    "additionalProperties": False,
    "minProperties": 2,
    "maxProperties": 2,
}


def test_every_choice_the_count_allows_is_generated():
    assert accepts(INPUT, {"json": "a", "placeholder": 1})
    assert accepts(INPUT, {"placeholder": 2, "pojo": {"field": "x"}})
    assert not accepts(INPUT, {"placeholder": 1})
    assert not accepts(INPUT, {"json": "a", "placeholder": 1, "pojo": {}})
    assert not accepts(INPUT, {"json": "a", "pojo": {}})  # placeholder is required


def test_counts_match_the_bounds_exactly():
    props = {k: {"type": "integer"} for k in "abc"}
    schema = {"type": "object", "properties": props, "minProperties": 1, "maxProperties": 2}
    for k in range(4):
        for names in itertools.combinations("abc", k):
            value = {n: 1 for n in names}
            assert accepts(schema, value) == (1 <= k <= 2), value


def test_no_narrowing_is_reported_for_a_counted_object():
    props = {k: {"type": "integer"} for k in "abc"}
    _, rewrites = normalize_schema({"type": "object", "properties": props, "minProperties": 1})
    assert not any("minProperties" in r for r in rewrites)


def test_an_empty_object_is_a_choice_when_the_count_allows_it():
    props = {k: {"type": "integer"} for k in "abc"}
    schema = {"type": "object", "properties": props, "maxProperties": 1}
    assert accepts(schema, {}) and accepts(schema, {"b": 1})
    assert not accepts(schema, {"a": 1, "b": 2})
