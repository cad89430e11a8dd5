"""A property no value fits stays absent through every later meet.

`allOf` of `{"b": {"const": "y"}}` and `{"b": {"type": "integer"}}` leaves `b` no value:
an object that has it is invalid. A third member (or a oneOf branch, or a `then`) that
declares `b` must not bring it back with only its own schema.
"""

from __future__ import annotations

import jsonschema
import pytest
from json_accepts import accepts

B_CONST = {"type": "object", "properties": {"b": {"const": "y"}}}
B_INTEGER = {"type": "object", "properties": {"b": {"type": "integer"}}}
B_STRING = {"type": "object", "properties": {"b": {"type": "string"}}}

SCHEMAS = [
    {"allOf": [B_CONST, B_INTEGER, B_STRING]},
    {"type": "object", "properties": {"b": False}, "allOf": [B_STRING]},
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "allOf": [
            {
                "oneOf": [
                    {"required": ["b"], "properties": {"b": {"type": "string"}}},
                    {"required": ["a"]},
                ]
            },
            B_CONST,
            B_INTEGER,
        ],
    },
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "if": {"properties": {"b": {"const": "y"}}},
        "then": {"required": ["b"], "properties": {"b": {"type": "string"}}},
        "else": {"required": ["a"]},
    },
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_the_property_is_never_generated(schema):
    for value in ({"b": "x"}, {"b": "y"}, {"b": 1}, {"a": 1, "b": "x"}):
        assert not accepts(schema, value)
        if accepts(schema, value):
            jsonschema.validate(value, schema)


def test_the_rest_is_still_generated():
    assert accepts(SCHEMAS[0], {})
    assert accepts(SCHEMAS[2], {"a": 1})
    assert accepts(SCHEMAS[3], {"a": 1, "b": 1})  # b fails `if`: the else side
