"""`not` of required names: objects generated without one of the optional properties."""

from __future__ import annotations

import pytest
from json_accepts import accepts

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex
from gclm.errors import UnsupportedSchemaError

# MaskBench Github_hard---o77367: `cmd` and `args` never both.
SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "cmd": {"type": "string"}, "args": {"type": "array"}},
    "required": ["id"],
    "additionalProperties": False,
    "not": {"allOf": [{"required": ["cmd"]}, {"required": ["args"]}]},
}


def test_never_both_properties():
    assert accepts(SCHEMA, {"id": "a", "cmd": "x"})
    assert accepts(SCHEMA, {"id": "a", "args": []})
    assert accepts(SCHEMA, {"id": "a"})
    assert not accepts(SCHEMA, {"id": "a", "cmd": "x", "args": []})


def test_rewrite_is_reported():
    rewrites = to_regex(Constraint.json_schema(SCHEMA)).rewrites
    assert any("without one of the optional properties ['cmd', 'args']" in r for r in rewrites)


def test_required_names_in_not_still_refused():
    # Both required: no optional property to leave out, so no value provably fails `not`.
    with pytest.raises(UnsupportedSchemaError) as e:
        to_regex(Constraint.json_schema({**SCHEMA, "required": ["id", "cmd", "args"]}))
    assert e.value.keyword == "not"
