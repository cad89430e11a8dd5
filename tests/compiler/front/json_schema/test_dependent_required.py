"""dependentRequired / dependencies of a required property that name undeclared properties."""

from __future__ import annotations

from json_accepts import accepts

# MaskBench Glaiveai2K---calculate_area_7eea9e32: `shape` is required and its dependents
# are not declared; refused before ("needs undeclared properties").
AREA = {
    "type": "object",
    "dependencies": {"shape": ["rectangle", "circle"]},
    "properties": {
        "dimensions": {"type": "object", "properties": {"width": {"type": "number"}}},
        "shape": {"type": "string", "enum": ["rectangle", "circle"]},
    },
    "required": ["shape", "dimensions"],
}


def test_dependents_of_a_required_trigger_are_generated():
    value = {"dimensions": {"width": 2}, "shape": "circle", "rectangle": 1, "circle": [True]}
    assert accepts(AREA, value)
    assert not accepts(AREA, {"dimensions": {}, "shape": "circle"})  # dependents missing


def test_dependents_chain_to_a_fixpoint_and_take_additional_properties():
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
        "dependentRequired": {"a": ["b"], "b": ["c"]},
        "additionalProperties": {"type": "string"},
    }
    assert accepts(schema, {"a": 1, "b": "x", "c": "y"})
    assert not accepts(schema, {"a": 1, "b": "x"})
    assert not accepts(schema, {"a": 1, "b": 2, "c": "y"})
