"""if/then/else: anyOf [if and then, else and provably not if]."""

from __future__ import annotations

import pytest
from json_accepts import accepts

from gclm.compiler.front.json_schema.normalize import normalize_schema
from gclm.errors import UnsupportedSchemaError

# The shape of MaskBench JsonSchemaStore---codeship-steps (refused before): a `type`
# discriminator decides which properties are required.
STEP = {
    "type": "object",
    "properties": {
        "type": {"enum": ["run", "push"]},
        "command": {"type": "string"},
        "image": {"type": "string"},
    },
    "required": ["type"],
    "additionalProperties": False,
    "if": {"properties": {"type": {"const": "run"}}},
    "then": {"required": ["command"]},
    "else": {"required": ["image"]},
}


def test_each_branch_is_generated_with_its_own_requirements():
    assert accepts(STEP, {"type": "run", "command": "ls"})
    assert accepts(STEP, {"type": "push", "image": "x"})
    assert accepts(STEP, {"type": "push", "command": "ls", "image": "x"})
    assert not accepts(STEP, {"type": "run", "image": "x"})  # then: command required
    assert not accepts(STEP, {"type": "push", "command": "ls"})  # else: image required


def test_then_alone_leaves_other_values_free():
    schema = {"enum": [1, 5, 15, 25], "if": {"minimum": 10}, "then": {"maximum": 20}}
    assert accepts(schema, 15) and accepts(schema, 5) and accepts(schema, 1)
    assert not accepts(schema, 25)


def test_an_else_branch_that_cannot_be_told_apart_is_left_out_and_reported():
    schema = {"type": "string", "if": {"pattern": "^a"}, "then": {"maxLength": 3}, "else": {}}
    _, rewrites = normalize_schema(schema)
    assert "/else: values taking the 'else' branch are not generated" in rewrites
    assert accepts(schema, "abc") and not accepts(schema, "abcd")


def test_no_branch_that_can_be_generated_is_refused():
    schema = {"type": "string", "if": {"pattern": "^a"}, "then": False, "else": {}}
    with pytest.raises(UnsupportedSchemaError) as e:
        normalize_schema(schema)
    assert e.value.keyword == "if"
