"""oneOf of required names: each branch is generated without the optional properties the
other branches require, so every value matches exactly one branch (a narrowing, reported)."""

from __future__ import annotations

from itertools import combinations

import jsonschema
import pytest
from json_accepts import accepts

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex
from gclm.errors import UnsupportedSchemaError

NAMES = ("radius", "width", "height", "base")

# Either a circle's radius, or a rectangle's width and height, or a triangle's base and height.
SHAPE = {
    "type": "object",
    "properties": {n: {"type": "number"} for n in NAMES},
    "oneOf": [
        {"required": ["radius"]},
        {"required": ["width", "height"]},
        {"required": ["base", "height"]},
    ],
}


def every_subset(names: tuple[str, ...]) -> list[dict[str, int]]:
    return [
        {n: 1 for n in chosen} for k in range(len(names) + 1) for chosen in combinations(names, k)
    ]


@pytest.mark.parametrize("value", every_subset(NAMES))
def test_every_accepted_value_is_valid(value):
    if accepts(SHAPE, value):
        jsonschema.validate(value, SHAPE)


def test_each_branch_is_generated():
    assert accepts(SHAPE, {"radius": 1})
    assert accepts(SHAPE, {"width": 1, "height": 2})
    assert accepts(SHAPE, {"height": 2, "base": 1})  # in declared order
    # Valid, but `width` beside a triangle is left out of the third branch.
    assert not accepts(SHAPE, {"width": 3, "height": 2, "base": 1})


def test_narrowing_is_reported():
    rewrites = to_regex(Constraint.json_schema(SHAPE)).rewrites
    assert any("/oneOf/0: objects generated without the optional properties" in r for r in rewrites)


def test_required_names_behind_ref_and_allof():
    schema = {
        "type": "object",
        "properties": {"vcs": {"type": "string"}, "url": {"type": "string"}},
        "oneOf": [{"$ref": "#/$defs/vcs"}, {"allOf": [{"required": ["url"]}]}],
        "$defs": {"vcs": {"required": ["vcs"]}},
    }
    assert accepts(schema, {"vcs": "git"})
    assert accepts(schema, {"url": "x"})
    assert not accepts(schema, {"vcs": "git", "url": "x"})
    assert not accepts(schema, {})


def test_a_name_both_branches_require_proves_nothing():
    # `a` is required by both: no optional property to leave out, {"a": 1} matches both.
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
        "oneOf": [{"required": ["a"]}, {"properties": {"a": {"minimum": 0}}}],
    }
    with pytest.raises(UnsupportedSchemaError) as e:
        to_regex(Constraint.json_schema(schema))
    assert e.value.keyword == "oneOf"


def test_required_names_become_declared():
    # A required name is declared (generated alone), so each branch already lacks the other's.
    schema = {"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}
    assert accepts(schema, {"a": 1})
    assert not accepts(schema, {"a": 1, "b": 1})
