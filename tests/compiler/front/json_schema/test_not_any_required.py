"""`not` of an anyOf of required names: objects generated without every one of them.

`{"not": {"anyOf": [{"required": ["a"]}, {"required": ["b"]}]}}` holds for objects with
neither `a` nor `b`; gclm leaves each optional one out (reported). The usual spelling of
"exactly one of a, b, or neither" is a oneOf with such a branch.
"""

from __future__ import annotations

from itertools import combinations

import jsonschema
import pytest
from json_accepts import accepts

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex
from gclm.errors import ConstraintError, UnsupportedSchemaError

PROPS = {"id": {"type": "string"}, "a": {"type": "integer"}, "b": {"type": "integer"}}
NEITHER = {
    "type": "object",
    "properties": PROPS,
    "not": {"anyOf": [{"required": ["a"]}, {"required": ["b"]}]},
}
AT_MOST_ONE = {
    "type": "object",
    "properties": PROPS,
    "oneOf": [
        {"required": ["a"]},
        {"required": ["b"]},
        {"not": {"anyOf": [{"required": ["a"]}, {"required": ["b"]}]}},
    ],
}
VALUES = [{n: 1 if n != "id" else "x" for n in c} for k in range(4) for c in combinations(PROPS, k)]


@pytest.mark.parametrize("schema", [NEITHER, AT_MOST_ONE])
@pytest.mark.parametrize("value", VALUES)
def test_every_accepted_value_is_valid(schema, value):
    if accepts(schema, value):
        jsonschema.validate(value, schema)


def test_neither_name_is_generated():
    assert accepts(NEITHER, {"id": "x"})
    assert not accepts(NEITHER, {"id": "x", "a": 1})
    assert not accepts(NEITHER, {"b": 1})
    rewrites = to_regex(Constraint.json_schema(NEITHER)).rewrites
    assert any(
        "without the optional properties ['a', 'b'], so that they fail" in r for r in rewrites
    )


def test_at_most_one_name_is_generated():
    assert accepts(AT_MOST_ONE, {"id": "x", "a": 1})
    assert accepts(AT_MOST_ONE, {"b": 1})
    assert accepts(AT_MOST_ONE, {"id": "x"})
    assert not accepts(AT_MOST_ONE, {"a": 1, "b": 1})


def test_a_required_name_leaves_no_value():
    # Every object has `a`, so every object meets the `not` subschema: nothing is valid.
    schema = {**NEITHER, "required": ["a"]}
    with pytest.raises(ConstraintError, match="No JSON value satisfies"):
        to_regex(Constraint.json_schema(schema))


def test_a_name_that_may_be_written_freely_still_refused():
    # Free keys may be `a`: no property to leave out.
    schema = {"type": "object", "not": NEITHER["not"]}
    with pytest.raises(UnsupportedSchemaError) as e:
        to_regex(Constraint.json_schema(schema))
    assert e.value.keyword == "not"
