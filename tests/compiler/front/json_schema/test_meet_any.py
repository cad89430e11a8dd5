"""A `true` subschema (any value) met with another schema is that schema, however deep."""

from __future__ import annotations

from json_accepts import accepts

from gclm.compiler.front.json_schema.ops import any_node, is_any, meet

ITEMS = {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "string"}}}}


def test_pattern_properties_value_nests_deeper_than_any_depth():
    # MaskBench Github_hard---o14390: undeclared keys (additionalProperties defaults to
    # true) hold a patternProperties schema of arrays of objects; the meet with the
    # depth-1 stand-in for `true` had cut it to `[]`.
    schema = {"type": "object", "patternProperties": {"^[a-f]+$": ITEMS}}
    assert accepts(schema, {"abc": [{"a": "x"}, {"a": "y"}]})
    assert accepts(schema, {"abc": []})
    assert not accepts(schema, {"abc": [{"a": 1}]})


def test_declared_empty_property_takes_its_pattern_properties_schema():
    schema = {
        "type": "object",
        "properties": {"abc": {}},
        "required": ["abc"],
        "patternProperties": {"^a": ITEMS},
    }
    assert accepts(schema, {"abc": [{"a": "x"}]})
    assert not accepts(schema, {"abc": 3})


def test_is_any_recognises_any_node_only():
    assert all(is_any(any_node(d)) for d in range(4))
    assert not is_any({"anyOf": [{"type": "null"}, {"type": "boolean"}]})
    assert not is_any({"anyOf": [{"type": t} for t in ("null", "boolean", "number", "string")]})
    assert not is_any(ITEMS)
    assert meet(any_node(1), ITEMS, "") == ITEMS
    assert meet(ITEMS, any_node(0), "") == ITEMS


def test_a_schema_that_spells_any_scalar_is_not_any():
    # The same union as any_node(0), written by the user: a real constraint.
    scalar = {"type": ["null", "boolean", "number", "string"]}
    schema = {"type": "object", "properties": {"x": {"allOf": [scalar, ITEMS]}}}
    assert not accepts(schema, {"x": []})
    assert accepts(schema, {})
