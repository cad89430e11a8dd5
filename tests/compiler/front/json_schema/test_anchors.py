"""`$` inside a pattern: the rewrite matches exactly what an ECMA-262 search matches."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gclm.compiler.front.json_schema.patterns import pattern_regex
from gclm.errors import UnsupportedSchemaError

# Real patterns (MaskBench Github_hard---o77367 and o65011) and small cases of each rule.
PATTERNS = [
    r"^(\/?((\.{2})|([a-z0-9\-]*))($|\/))*$",
    r"(a|b$)c?",
    r"^(a|b$)",
    r"(ab$|c)+",
    r"(a$|b){2,3}",
    r"x(y$)?",
    r"(a$)*b?",
]


def generated(pattern: str, value: str) -> bool:
    return re.fullmatch(pattern_regex(pattern, ""), json.dumps(value)[1:-1]) is not None


def searched(pattern: str, value: str) -> bool:
    # Python's `$` also matches before a final newline; ECMA's does not: \Z is ECMA's `$`.
    return re.search(pattern.replace("$", r"\Z"), value) is not None


@pytest.mark.parametrize("pattern", PATTERNS)
@settings(max_examples=150, deadline=None)
@given(value=st.text(alphabet="abcxy/.-A ", max_size=8))
def test_end_anchor_inside_matches_ecma_search(pattern, value):
    assert generated(pattern, value) == searched(pattern, value)


def test_path_pattern_examples():
    pattern = PATTERNS[0]
    assert generated(pattern, "../a/b/") and generated(pattern, "") and generated(pattern, "a")
    assert not generated(pattern, "a..") and not generated(pattern, "A")


def test_pattern_that_matches_nothing_is_refused():
    with pytest.raises(UnsupportedSchemaError, match="matches no string"):
        pattern_regex("x$y", "/p")


def test_start_anchor_inside_is_still_refused():
    with pytest.raises(UnsupportedSchemaError, match="anchor"):
        pattern_regex("a(^b|c)", "/p")
