"""An optional discriminator under `not` or `if`: the values that fail it need it present.

`{"properties": {"kind": {"const": "run"}}}` holds for every object without `kind` (a
`properties` check on an absent name passes), so the objects that fail it are those with
`kind` present and not "run": the `else` side of such an `if`, and what such a `not`
allows, are generated with `kind` required (reported) and its values cut.
"""

from __future__ import annotations

from itertools import product

import jsonschema
import pytest
from json_accepts import accepts

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex

PROPS = {
    "kind": {"enum": ["run", "push", "pull"]},
    "command": {"type": "string"},
    "image": {"type": "string"},
}
# MaskBench JsonSchemaStore---codeship-steps' shape, with `kind` optional.
STEP = {
    "type": "object",
    "properties": PROPS,
    "additionalProperties": False,
    "if": {"properties": {"kind": {"const": "run"}}},
    "then": {"required": ["command"]},
    "else": {"required": ["image"]},
}
NOT_RUN = {
    "type": "object",
    "properties": PROPS,
    "not": {"properties": {"kind": {"const": "run"}}},
}
# A kind no value of which is "run": it only has to be present.
NOT_RUN_PATTERN = {
    "type": "object",
    "properties": {**PROPS, "kind": {"type": "string", "pattern": "^p"}},
    "not": {"properties": {"kind": {"const": "run"}}},
}
CANDIDATES = [
    {k: v for k, v in zip(("kind", "command", "image"), vs, strict=True) if v is not None}
    for vs in product(["run", "push", "pull", None], ["ls", None], ["x", None])
]


@pytest.mark.parametrize("schema", [STEP, NOT_RUN, NOT_RUN_PATTERN])
def test_every_accepted_value_is_valid(schema):
    accepted = [v for v in CANDIDATES if accepts(schema, v)]
    assert len(accepted) >= 4
    for value in accepted:
        jsonschema.validate(value, schema)


def test_else_side_is_generated_with_the_discriminator():
    assert accepts(STEP, {"kind": "push", "image": "x"})
    assert accepts(STEP, {"kind": "pull", "command": "ls", "image": "x"})
    assert accepts(STEP, {"command": "ls"})  # no kind: `if` holds, so `then` applies
    assert not accepts(STEP, {"image": "x"})  # valid for no side: no kind means `then`


@pytest.mark.parametrize("schema", [NOT_RUN, NOT_RUN_PATTERN])
def test_not_keeps_the_other_kinds_present(schema):
    assert accepts(schema, {"kind": "push"})
    assert not accepts(schema, {"kind": "run"})
    assert not accepts(schema, {"command": "ls"})  # no kind: meets the `not` subschema


def test_narrowing_is_reported():
    rewrites = to_regex(Constraint.json_schema(STEP)).rewrites
    assert any("with ['kind'] present, so that they fail" in r for r in rewrites)
