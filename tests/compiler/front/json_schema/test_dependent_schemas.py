"""dependentSchemas (and schema-form `dependencies`) of an optional trigger.

The dependent schema applies when the trigger is present, so the object is two: without
the trigger, or with it (required) and the dependent schema met. Four optional triggers
at most (16 objects); past that the keyword is refused.
"""

from __future__ import annotations

from itertools import product

import jsonschema
import pytest
from json_accepts import accepts

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex
from gclm.errors import UnsupportedSchemaError

# A reference names its website only for sections.
REFERENCE = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "type": {"type": "string"},
        "website": {"type": "string"},
    },
    "required": ["id"],
    "additionalProperties": False,
    "dependentSchemas": {"website": {"properties": {"type": {"enum": ["section"]}}}},
}
# draft-04 spelling; the dependent schema limits the object to its one key.
EXPECTED = {
    "$schema": "http://json-schema.org/draft-04/schema#",
    "properties": {"error": {"type": "string"}, "value": {"type": "integer"}},
    "dependencies": {"error": {"maxProperties": 1}},
}

CANDIDATES = [
    {k: v for k, v in zip(("id", "type", "website", "error", "value"), vs, strict=True) if v}
    for vs in product(["a", None], ["section", "story", None], ["w", None], ["e", None], [1, None])
]


@pytest.mark.parametrize("schema", [REFERENCE, EXPECTED])
def test_every_accepted_value_is_valid(schema):
    accepted = [v for v in CANDIDATES if accepts(schema, v)]
    assert len(accepted) > 2
    for value in accepted:
        jsonschema.validate(value, schema)


def test_both_objects_are_generated():
    assert accepts(REFERENCE, {"id": "a", "type": "story"})  # no trigger: no dependent schema
    assert accepts(REFERENCE, {"id": "a", "type": "section", "website": "w"})
    assert accepts(REFERENCE, {"id": "a", "website": "w"})
    assert not accepts(REFERENCE, {"id": "a", "type": "story", "website": "w"})
    assert accepts(EXPECTED, {"error": "e"})
    assert accepts(EXPECTED, {"value": 1})
    assert not accepts(EXPECTED, {"error": "e", "value": 1})


def test_trigger_left_out_stays_out_through_allof():
    # The object without `website` must not get it back from a sibling that declares it.
    sibling = {"type": "object", "properties": {"website": {"type": "string"}}}
    schema = {"allOf": [{**REFERENCE, "additionalProperties": True}, sibling]}
    assert not accepts(schema, {"id": "a", "type": "story", "website": "w"})
    assert accepts(schema, {"id": "a", "type": "section", "website": "w"})


def test_five_optional_triggers_are_refused():
    schema = {
        "type": "object",
        "properties": {n: {"type": "integer"} for n in "abcdef"},
        "dependentSchemas": {n: {"required": ["f"]} for n in "abcde"},
    }
    with pytest.raises(UnsupportedSchemaError) as e:
        to_regex(Constraint.json_schema(schema))
    assert e.value.keyword == "dependentSchemas"
    assert "5 optional triggers" in e.value.message
