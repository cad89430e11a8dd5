"""additionalProperties false with patternProperties: keys generated to match a pattern."""

from __future__ import annotations

import pytest
from json_accepts import accepts

# MaskBench Github_easy---o84043: a hash of script names to shell commands.
SCRIPTS = {
    "type": "object",
    "additionalProperties": False,
    "patternProperties": {"^([a-z0-9-])+$": {"type": "string"}},
}


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        ({}, True),
        ({"build": "npm run build"}, True),
        ({"build": "a", "test-2": 'say "hi"'}, True),
        ({"Build": "a"}, False),  # the name does not match
        ({"build": 1}, False),  # the value does not match
        ({"build": "a", "x y": "b"}, False),
    ],
)
def test_keys_match_a_pattern(value, valid):
    assert accepts(SCRIPTS, value) is valid
    assert accepts({"type": "object", "properties": {"s": SCRIPTS}}, {"s": value}) is valid


def test_value_meets_every_pattern_and_counts_hold():
    schema = {
        **SCRIPTS,
        "patternProperties": {"^[a-z]+$": {"type": "string"}, "^a": {"maxLength": 2}},
        "minProperties": 1,
        "maxProperties": 2,
    }
    assert accepts(schema, {"ab": "xy"})
    assert accepts(schema, {"ab": "xy", "b": "z"})
    assert not accepts(schema, {})
    assert not accepts(schema, {"ab": "xyz"})  # "ab" matches both: maxLength 2 applies
    assert not accepts(schema, {"a": "x", "b": "y", "c": "z"})


def test_allof_with_other_key_patterns_allows_no_undeclared_key():
    other = {**SCRIPTS, "patternProperties": {"^x": {"type": "string"}}}
    schema = {"allOf": [SCRIPTS, other]}
    assert accepts(schema, {})
    assert not accepts(schema, {"xa": "b"})


def test_declared_properties_still_take_their_pattern_schemas():
    schema = {**SCRIPTS, "properties": {"name": {"type": "string"}}, "required": ["name"]}
    assert accepts(schema, {"name": "n"})
    assert not accepts(schema, {"name": 1})
