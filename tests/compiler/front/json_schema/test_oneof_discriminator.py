"""oneOf told apart by an optional property's value: each branch is generated with it
required (a narrowing, reported), so its value rules the other branches out."""

from __future__ import annotations

from itertools import product

import jsonschema
import pytest
from json_accepts import accepts

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex

# `shape` is never required, but each branch names its own.
AREA = {
    "type": "object",
    "properties": {"shape": {"type": "string"}, "r": {"type": "number"}, "w": {"type": "number"}},
    "oneOf": [
        {"properties": {"shape": {"const": "circle"}}},
        {"properties": {"shape": {"const": "square"}}},
        {"$ref": "#/$defs/other"},
    ],
    "$defs": {"other": {"properties": {"shape": {"enum": ["dot", "line"]}}}},
}

CANDIDATES = [
    {k: v for k, v in zip(("shape", "r", "w"), vs, strict=True) if v is not None}
    for vs in product(["circle", "square", "dot", "line", "star", None], [1, None], [2, None])
]


@pytest.mark.parametrize("value", CANDIDATES)
def test_every_accepted_value_is_valid(value):
    if accepts(AREA, value):
        jsonschema.validate(value, AREA)


def test_each_branch_is_generated_with_its_discriminator():
    assert accepts(AREA, {"shape": "circle", "r": 1})
    assert accepts(AREA, {"shape": "square", "w": 2})
    assert accepts(AREA, {"shape": "line"})
    assert not accepts(AREA, {"r": 1})  # valid for no branch: it matches all three


def test_narrowing_is_reported():
    rewrites = to_regex(Constraint.json_schema(AREA)).rewrites
    assert any("/oneOf/1: objects generated with ['shape'] required" in r for r in rewrites)
