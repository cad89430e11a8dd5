"""propertyNames on an object without declared properties: its keys are generated from it.

A name is a string, so a propertyNames that is one `pattern`, a `format` gclm writes, or an
`enum`/`const` of strings becomes the pattern every generated key matches. Anything else
(length bounds, a `not`...) is still refused, as is one beside `additionalProperties:
false` with patternProperties (a key would have to match two patterns).
"""

from __future__ import annotations

import jsonschema
import pytest
from json_accepts import accepts

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex
from gclm.errors import UnsupportedSchemaError

NAMES = [
    {"pattern": "^[a-z]{1,3}$"},
    {"type": "string", "enum": ["a b", "c.d"]},
    {"const": "x"},
    {"format": "regex", "description": "each key is a regex"},
]
OBJECTS = [{}, {"ab": 1}, {"a b": 1, "c.d": 2}, {"x": 1}, {"AB": 1}, {"(": 1}, {"abcd": 1}]


def free(names: dict) -> dict:
    return {"type": "object", "additionalProperties": {"type": "integer"}, "propertyNames": names}


@pytest.mark.parametrize("names", NAMES)
@pytest.mark.parametrize("value", OBJECTS)
def test_every_accepted_object_is_valid(names, value):
    schema = free(names)
    if accepts(schema, value):
        checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
        jsonschema.validate(value, schema, format_checker=checker)


def test_keys_follow_the_names():
    assert accepts(free(NAMES[0]), {"ab": 1, "x": 2})
    assert not accepts(free(NAMES[0]), {"abcd": 1})
    assert accepts(free(NAMES[1]), {"a b": 1, "c.d": 2})
    assert not accepts(free(NAMES[1]), {"ab": 1})
    assert accepts(free(NAMES[3]), {"a/b": 1})


@pytest.mark.parametrize(
    "schema",
    [
        free({"maxLength": 3}),
        free({"not": {"const": "0"}}),
        {
            "type": "object",
            "patternProperties": {"^a": {"type": "integer"}},
            "additionalProperties": False,
            "propertyNames": {"pattern": "^[a-z]+$"},
        },
    ],
)
def test_other_property_names_still_refused(schema):
    with pytest.raises(UnsupportedSchemaError) as e:
        to_regex(Constraint.json_schema(schema))
    assert e.value.keyword == "propertyNames"
    assert "one pattern, format or enum of names" in e.value.message
