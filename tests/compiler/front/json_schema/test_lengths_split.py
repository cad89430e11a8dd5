"""Length bounds folded into patterns with optional repeats and inner alternations."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gclm.compiler.front.json_schema.patterns import pattern_regex

# MaskBench Github_hard---o82851 (both with maxLength), once refused.
CURIE = r"^([a-z0-9-]+):([a-z0-9\.-]+):([a-z0-9-]+)?:([a-z0-9-]+)$"
TAG = r"^([\w\/-]|[\w-][\w\/-]*[\w-])$"


def generated(pattern: str, value: str, **lengths) -> bool:
    regex = pattern_regex(pattern, "", **lengths)
    return re.fullmatch(regex, json.dumps(value)[1:-1]) is not None


@pytest.mark.parametrize(
    ("pattern", "value"),
    [(CURIE, "a:b::c"), (CURIE, "ab:c.d:e:f"), (TAG, "a"), (TAG, "/"), (TAG, "ab/de")],
)
def test_bounded_patterns_compile_and_keep_short_matches(pattern, value):
    assert generated(pattern, value, max_length=20)


@pytest.mark.parametrize("pattern", [CURIE, TAG])
@settings(max_examples=200, deadline=None)
@given(value=st.text(alphabet="ab-/:.", max_size=9))
def test_generated_strings_match_pattern_and_bounds(pattern, value):
    if generated(pattern, value, min_length=2, max_length=6):
        assert re.search(pattern, value) and 2 <= len(value) <= 6
