"""Strings that start differently are disjoint: a oneOf or `not` proven by first characters.

A pattern anchored with `^` that must match a character there fixes the first character
of every string it matches; gclm's formats fix theirs (`uri`: `h` or `f`). When the first
characters a node writes and those a schema's pattern allows do not meet, no generated
string matches that schema (the empty string matches no such pattern).
"""

from __future__ import annotations

import jsonschema
import pytest
from json_accepts import accepts

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex
from gclm.errors import UnsupportedSchemaError

IDS = {
    "oneOf": [{"type": "string", "pattern": "^[0-9]+$"}, {"type": "string", "pattern": "^[a-z]"}]
}
# A style URL: an absolute URI, or a relative path starting with "./".
STYLE = {"oneOf": [{"type": "string", "format": "uri"}, {"type": "string", "pattern": "^\\./.+$"}]}
TEXTS = ["", "12", "1a", "a1", "ab", "./x", "http://a.example", "Z", "é", "٣"]


@pytest.mark.parametrize("schema", [IDS, STYLE])
@pytest.mark.parametrize("text", TEXTS)
def test_every_accepted_string_is_valid(schema, text):
    if accepts(schema, text):
        jsonschema.validate(
            text, schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
        )


def test_both_branches_are_generated():
    assert accepts(IDS, "12") and accepts(IDS, "ab") and accepts(IDS, "a1")
    assert not accepts(IDS, "1a")


def test_format_branch_is_proven_the_pattern_branch_is_not():
    # "./x" is no URI only by the format's rules, which gclm never uses to reject: a
    # validator may read `format` as an annotation. So only the URIs are generated.
    assert accepts(STYLE, "http://a.example")
    assert not accepts(STYLE, "./x")
    rewrites = to_regex(Constraint.json_schema(STYLE)).rewrites
    assert any("might match more than one branch are not generated" in r for r in rewrites)


def test_not_of_a_pattern_that_starts_elsewhere():
    schema = {"type": "string", "pattern": "^b", "not": {"pattern": "^a"}}
    assert accepts(schema, "b1")


@pytest.mark.parametrize(
    "patterns",
    [
        ("^[a-z]", "^[a-m]x"),  # overlapping first characters
        ("[0-9]", "^[a-z]"),  # unanchored: "a1" contains a digit
        ("^a*", "^b"),  # `^a*` matches "" at the start of "b"
        ("^\\w", "^é"),  # Python's `re` reads \w as Unicode: "é" matches both
    ],
)
def test_strings_that_may_share_a_start_are_refused(patterns):
    schema = {"oneOf": [{"type": "string", "pattern": p} for p in patterns]}
    with pytest.raises(UnsupportedSchemaError) as e:
        to_regex(Constraint.json_schema(schema))
    assert e.value.keyword == "oneOf"
