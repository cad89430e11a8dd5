"""oneOf of closed objects: a required key one branch forbids proves the branches exclusive."""

from __future__ import annotations

from json_accepts import accepts


def closed(*names: str) -> dict:
    return {
        "type": "object",
        "properties": {n: {"type": "string"} for n in names},
        "required": list(names),
        "additionalProperties": False,
    }


# MaskBench Github_hard---o14390: a change log item is added, deleted or modified.
CHANGE = {
    "type": "object",
    "oneOf": [
        closed("property", "newValue"),
        closed("property", "oldValue"),
        closed("property", "oldValue", "newValue"),
    ],
}


def test_every_branch_is_generated():
    assert accepts(CHANGE, {"property": "a", "newValue": "b"})
    assert accepts(CHANGE, {"property": "a", "oldValue": "b"})
    assert accepts(CHANGE, {"property": "a", "oldValue": "b", "newValue": "c"})
    assert not accepts(CHANGE, {"property": "a"})


def test_open_branches_are_not_proven_exclusive():
    # Without additionalProperties false, {property, oldValue, newValue} matches all three.
    schema = {"oneOf": [{**b, "additionalProperties": True} for b in CHANGE["oneOf"]]}
    assert not accepts(schema, {"property": "a", "oldValue": "b", "newValue": "c"})


def test_free_keys_are_not_proven_to_lack_a_required_name():
    # `{"type": "object"}` writes free keys, `"a"` among them: {"a": 1} matches both object
    # branches, so neither is generated; the string branch still is.
    for free in (
        {"type": "object"},
        {"type": "object", "additionalProperties": {"type": "integer"}},
    ):
        schema = {"oneOf": [free, {"type": "object", "required": ["a"]}, {"type": "string"}]}
        assert not accepts(schema, {"a": 1})
        assert accepts(schema, "x")
