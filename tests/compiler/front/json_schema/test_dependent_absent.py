"""A dependency's trigger that an object does not declare stays absent through allOf.

dependentRequired and dependentSchemas apply when the trigger is present. An object that
does not declare its trigger never writes it, and an allOf sibling that declares it must
not bring it back: the dependency would go unchecked.
"""

from __future__ import annotations

import jsonschema
import pytest
from json_accepts import accepts

SIBLING = {"type": "object", "properties": {"b": {"type": "string"}}}
DEPENDENCIES = [
    {"dependentRequired": {"b": ["c"]}},
    {"dependentSchemas": {"b": {"required": ["c"]}}},
    {"dependencies": {"b": ["c"]}},
    {"dependencies": {"b": {"required": ["c"]}}},
]


@pytest.mark.parametrize("dependency", DEPENDENCIES)
def test_trigger_declared_by_a_sibling_is_not_generated(dependency):
    own = {"type": "object", "properties": {"a": {"type": "integer"}}, **dependency}
    schema = {"allOf": [own, SIBLING]}
    assert not accepts(schema, {"b": "x"})
    jsonschema.validate({"a": 1}, schema)
    assert accepts(schema, {"a": 1})
