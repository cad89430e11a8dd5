"""Class escapes read the same by ECMA-262 and by Python's `re` (the `jsonschema` package):
a pattern generates only characters both readings accept (h54's soundness fuzz found
U+FEFF generated for \\s, which `re` does not call a space)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from gclm.compiler.front.json_schema.patterns import pattern_regex

# (pattern, a character ECMA-262 and `re` disagree on, whether the pattern could take it)
DISAGREED = [
    (r"^a\sb$", "\ufeff"),  # ECMA: a space; re: not
    (r"^a\Sb$", "\ufeff"),
    (r"^a\Sb$", "\x85"),  # re: a space; ECMA: not
    (r"^a[^\s]b$", "\ufeff"),
    (r"^a[^\s]b$", "\x85"),
    (r"^a[^\S]b$", "\ufeff"),
    (r"^a[x\s]b$", "\ufeff"),
]


def generated(pattern: str, value: str) -> bool:
    text = json.dumps(value, ensure_ascii=False)[1:-1]
    return re.fullmatch(pattern_regex(pattern, ""), text) is not None


@pytest.mark.parametrize(("pattern", "char"), DISAGREED)
def test_a_character_the_readings_disagree_on_is_never_generated(pattern, char):
    assert not generated(pattern, f"a{char}b")


@pytest.mark.parametrize(
    ("pattern", "value"),
    [(r"^a\sb$", "a b"), (r"^a\sb$", "a\u3000b"), (r"^a\Sb$", "axb"), (r"^a[^\s]b$", "aéb")],
)
def test_what_both_readings_accept_is_still_generated(pattern, value):
    assert generated(pattern, value)
    jsonschema.validate(value, {"type": "string", "pattern": pattern})
