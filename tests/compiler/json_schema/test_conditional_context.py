"""An if/then/else in an allOf member is applied within the object its siblings build.

`then` is normalised within what meets `if` (and `else` within what provably fails it),
so a `not` of required names in `then` can leave the sibling's optional property out.
"""

from __future__ import annotations

from itertools import combinations

import jsonschema
import pytest
from json_accepts import accepts

from gclm.compiler.constraint import Constraint
from gclm.compiler.regex import to_regex

# MaskBench JsonSchemaStore---utam-page-object's action: `apply` and `applyExternal` are
# never both present (refused before: the `not` was normalised without the object).
ACTION = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "element": {"type": "string"},
        "apply": {"type": "string"},
        "applyExternal": {"type": "object", "properties": {"invoke": {"type": "string"}}},
    },
    "allOf": [
        {"if": {"required": ["apply"]}, "then": {"not": {"required": ["applyExternal"]}}},
        {
            "if": {"required": ["applyExternal"]},
            "then": {"required": ["applyExternal"], "not": {"required": ["apply"]}},
        },
    ],
}
VALUES = [
    {n: {} if n == "applyExternal" else "x" for n in chosen}
    for k in range(4)
    for chosen in combinations(("element", "apply", "applyExternal"), k)
]


@pytest.mark.parametrize("value", VALUES)
def test_every_accepted_value_is_valid(value):
    if accepts(ACTION, value):
        jsonschema.validate(value, ACTION)


def test_one_of_the_two_or_neither():
    assert accepts(ACTION, {"element": "x", "apply": "click"})
    assert accepts(ACTION, {"applyExternal": {"invoke": "f"}})
    assert accepts(ACTION, {"element": "x"})
    assert not accepts(ACTION, {"apply": "click", "applyExternal": {}})


def test_a_then_no_value_meets_leaves_the_else_side():
    # Every object meeting `if` fails `then` (it has `a`): the valid objects are those
    # without `a`, the else side.
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "allOf": [{"if": {"required": ["a"]}, "then": {"not": {"required": ["a"]}}}],
    }
    assert accepts(schema, {"b": 1})
    assert not accepts(schema, {"a": 1})
    rewrites = to_regex(Constraint.json_schema(schema)).rewrites
    assert any("/allOf/0/if/not: objects generated without" in r for r in rewrites)
