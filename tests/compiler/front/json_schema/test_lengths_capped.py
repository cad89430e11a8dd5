"""maxLength with a pattern or format whose repeats nest (`a+(\\.a+)*`): the repeats are capped."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gclm.compiler.front.json_schema.patterns import FORMATS, pattern_regex, string_regex
from gclm.errors import UnsupportedSchemaError

DOTTED = r"^[a-z]+(\.[a-z]+)*$"


def generated(regex: str, value: str) -> bool:
    return re.fullmatch(regex, json.dumps(value)) is not None


def test_email_with_max_length_compiles_and_keeps_common_addresses():
    # MaskBench Github_medium---o6231: `format: email` with `maxLength: 1024` (256 once
    # capped), refused before.
    regex = string_regex({"type": "string", "format": "email", "maxLength": 256}, "/e")
    assert regex is not None
    for value in ("john.doe@example.com", "a@b.co", "first.middle.last@mail.example.org"):
        assert generated(regex, value)
    assert not generated(regex, "not an email")


@settings(max_examples=300, deadline=None)
@given(value=st.text(alphabet="ab.", max_size=14))
def test_capped_pattern_is_a_subset_within_the_bound(value):
    regex = '"' + pattern_regex(DOTTED, "", max_length=9) + '"'
    if generated(regex, value):
        assert re.search(DOTTED, value) and len(value) <= 9


def test_capped_pattern_keeps_strings_up_to_the_cap():
    regex = '"' + pattern_regex(DOTTED, "", max_length=40) + '"'
    assert generated(regex, "ab.cd.ef")
    assert generated(regex, "abcde")  # k = 5: 5 + 5 * 6 <= 40


def test_a_bound_shorter_than_every_match_is_still_refused():
    with pytest.raises(UnsupportedSchemaError):
        pattern_regex(r"^[a-z]{5}(\.[a-z]+)*$", "", max_length=3)


@settings(max_examples=200, deadline=None)
@given(value=st.emails())
def test_capped_email_generates_only_valid_emails(value):
    regex = string_regex({"type": "string", "format": "email", "maxLength": 40}, "/e")
    if generated(regex, value):
        assert re.fullmatch(FORMATS["email"], value) and len(value) <= 40


def test_repeated_alternation_with_max_length_is_capped():
    # Refused before; (ab|c){1,2} now, every match at most 4 characters.
    regex = '"' + pattern_regex("^(ab|c)+$", "", max_length=4) + '"'
    assert generated(regex, "abab") and generated(regex, "cab")
    assert not generated(regex, "ababc") and not generated(regex, "")
