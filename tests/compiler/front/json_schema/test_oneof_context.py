"""A oneOf in an allOf member, or in a dependent schema, is proven against its siblings.

allOf is a conjunction, so a value matches `allOf: [S, {oneOf: [A, B]}]` when it matches S
and exactly one of A and B. gclm proves a branch exclusive on the values it generates: met
with S first, a branch's required discriminator (S requires `kind`) rules the others out.
"""

from __future__ import annotations

from itertools import product

import jsonschema
import pytest
from json_accepts import accepts

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex
from gclm.errors import UnsupportedSchemaError

KIND = {
    "type": "object",
    "properties": {"kind": {"enum": ["text", "avro"]}, "sep": {"type": "string"}},
    "required": ["kind"],
}
TEXT = {"properties": {"kind": {"const": "text"}, "sep": {"type": "string"}}}
AVRO = {"properties": {"kind": {"const": "avro"}}}
STORAGE = {"allOf": [KIND, {"oneOf": [TEXT, AVRO]}]}

# draft-06 dependencies: a present (and required) `kind` selects a branch by its value.
METRIC = {
    "$schema": "http://json-schema.org/draft-06/schema#",
    "type": "object",
    "properties": {"kind": {"enum": ["sum", "count"]}, "rules": {"type": "string"}},
    "required": ["kind"],
    "dependencies": {
        "kind": {
            "oneOf": [
                {"properties": {"kind": {"enum": ["sum"]}, "rules": {"type": "string"}}},
                {"properties": {"kind": {"enum": ["count"]}}},
            ]
        }
    },
}

CANDIDATES = [
    {k: v for k, v in zip(("kind", "sep", "rules"), values, strict=True) if v is not None}
    for values in product(["text", "avro", "sum", "count", None], [",", None], ["r", None])
]


@pytest.mark.parametrize("schema", [STORAGE, METRIC])
def test_every_accepted_value_is_valid(schema):
    accepted = [v for v in CANDIDATES if accepts(schema, v)]
    assert accepted
    for value in accepted:
        jsonschema.validate(value, schema)


def test_oneof_in_allof_sees_the_required_discriminator():
    assert accepts(STORAGE, {"kind": "text", "sep": ","})
    assert accepts(STORAGE, {"kind": "avro"})
    assert not accepts(STORAGE, {"sep": ","})


def test_oneof_in_a_dependent_schema_sees_the_object():
    assert accepts(METRIC, {"kind": "sum", "rules": "r"})
    assert accepts(METRIC, {"kind": "count"})


def test_overlapping_branches_still_refused():
    # {"kind": "text"} matches both branches, and no property tells them apart.
    loose = {"properties": {"sep": {"type": "string"}}}
    schema = {"allOf": [KIND, {"oneOf": [TEXT, loose]}]}
    with pytest.raises(UnsupportedSchemaError) as e:
        to_regex(Constraint.json_schema(schema))
    assert (e.value.keyword, e.value.pointer) == ("oneOf", "/allOf/1")


def test_a_true_branch_is_still_reported_as_bounded():
    # `{}` within the base of a bare oneOf is the bounded any-value node: reported as such.
    rewrites = to_regex(Constraint.json_schema({"oneOf": [{"type": "string"}, {}]})).rewrites
    assert any(r.startswith("/oneOf/1: accepts any JSON value") for r in rewrites)
