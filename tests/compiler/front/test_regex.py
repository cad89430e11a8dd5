"""to_regex for each constraint kind, checked in Python `re` and in outlines-core's own DFA."""

from __future__ import annotations

import dataclasses
import functools
import re

import outlines_core
import pytest

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.json_schema import JSON_OBJECT_DEPTH
from gclm.compiler.front.regex import RegexResult, json_regex, to_regex
from gclm.compiler.front.rust_regex import check_regex
from gclm.errors import CompileLimitError, ConstraintError


@functools.cache
def _index(regex: str) -> tuple[outlines_core.Index, dict[str, int]]:
    # One token per character: printable ASCII, common controls, and whatever else the
    # regex spells out literally.
    chars = sorted({chr(c) for c in range(0x20, 0x7F)} | set("\t\n\r") | set(regex))
    vocab = outlines_core.Vocabulary(len(chars), {c: [i] for i, c in enumerate(chars)})
    return outlines_core.Index(regex, vocab), {c: i for i, c in enumerate(chars)}


def rust_accepts(regex: str, text: str) -> bool:
    """Whether outlines-core's Index lets `text` through, one character per token."""
    index, ids = _index(regex)
    state = index.get_initial_state()
    for c in text:
        state = index.get_next_state(state, ids[c]) if c in ids else None
        if state is None:
            return False
    return index.is_final_state(state)


def accepts(regex: str, text: str) -> bool:
    """Both dialects must agree; each test then states one expectation."""
    python = re.fullmatch(regex, text) is not None
    assert rust_accepts(regex, text) == python, text
    return python


def test_result_is_frozen_with_tuple_rewrites():
    result = to_regex(Constraint.regex("ab"))
    assert isinstance(result, RegexResult)
    assert result.rewrites == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.regex = "x"  # type: ignore[misc]


# ---------------------------------------------------------------------------- regex


def test_regex_strips_one_outer_anchor_pair():
    assert to_regex(Constraint.regex("^ab+c$")).regex == "(?:ab+c)$"
    assert accepts(to_regex(Constraint.regex("^ab+c$")).regex, "abbc")


def test_regex_keeps_an_escaped_final_dollar():
    regex = to_regex(Constraint.regex(r"^price\$")).regex
    assert regex == r"(?:price\$)$"
    assert accepts(regex, "price$")
    assert not accepts(regex, "price")


def test_regex_start_anchor_inside_is_refused():
    # outlines-core cannot index a regex whose start depends on look-behind.
    with pytest.raises(ConstraintError, match="anchor inside"):
        to_regex(Constraint.regex("(^a|^b)"))


def test_regex_alternation_with_anchors_is_grouped():
    regex = to_regex(Constraint.regex("^a|b$")).regex
    assert accepts(regex, "a")
    assert accepts(regex, "b")
    assert not accepts(regex, "ab")


def test_a_match_may_continue_past_a_shorter_match():
    # Without the trailing `$`, outlines-core's Index would stop `abc` after `a`.
    regex = to_regex(Constraint.regex("a(bc)?")).regex
    assert rust_accepts(regex, "abc")
    assert rust_accepts(regex, "a")
    assert not rust_accepts("a(bc)?", "abc")  # the outlines-core behaviour worked around


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("(ab", "an unclosed '('"),
        ("a)(b", "an unmatched ')'"),
        ("a(?=b)", "look-ahead '(?='"),
        ("(?<!a)b", "look-behind '(?<!'"),
        (r"(a)\1", "backreferences"),
        ("[z-a]", "a syntax error"),
        (r"a\b", "word boundaries"),
        (r"a\Ab", "anchor inside"),
    ],
)
def test_bad_regex_says_why(pattern, reason):
    with pytest.raises(ConstraintError) as e:
        to_regex(Constraint.regex(pattern))
    assert reason in e.value.message
    assert "Rust regex syntax" in e.value.message


def test_check_regex_accepts_rust_only_syntax():
    for pattern in (r"\p{Greek}+", "[[:alpha:]]+", r"\x{41}", "(?<name>a)", "[]a]"):
        assert check_regex(pattern) == pattern


def test_check_regex_does_not_build_the_dfa():
    # `\w{300}` takes many seconds to determinize; the probe only parses it.
    assert check_regex(r"\w{300}") == r"\w{300}"


# ---------------------------------------------------------------------------- choice

CHOICES = ["a.b", "(x)", "a|b", 'say "hi"', "it's", "back\\slash", "tab\there", "é ü 日本", "[1]"]


def test_choice_matches_each_literal_exactly():
    regex = to_regex(Constraint.choice(CHOICES)).regex
    for choice in CHOICES:
        assert accepts(regex, choice), choice
    for near_miss in ("axb", "x", "a", "say hi", "back\\\\slash", "é", "1"):
        assert not accepts(regex, near_miss), near_miss


def test_choice_with_a_prefix_of_another_allows_both():
    regex = to_regex(Constraint.choice(["a", "abc"])).regex
    assert accepts(regex, "a")
    assert accepts(regex, "abc")
    assert not accepts(regex, "ab")


def test_empty_outputs_are_refused():
    # outlines-core drops every output that extends an earlier match, and an empty match
    # comes first: with `(ab)*` only the empty output would survive.
    assert not rust_accepts("(?:ab)*", "ab")
    with pytest.raises(ConstraintError, match="matches the empty string"):
        to_regex(Constraint.regex("(?:ab)*"))
    with pytest.raises(ConstraintError, match="empty string is not a supported choice"):
        to_regex(Constraint.choice(["", "a"]))


def test_choice_escapes_are_valid_in_both_dialects():
    regex = to_regex(Constraint.choice(["-&~#", "^$", "{2}"])).regex
    assert accepts(regex, "-&~#")
    assert accepts(regex, "^$")
    assert accepts(regex, "{2}")
    assert not accepts(regex, "--")


# ------------------------------------------------------------------------ json_object


def test_json_object_nests_to_the_documented_depth():
    # Python re only: outlines-core takes seconds to determinize this regex.
    assert JSON_OBJECT_DEPTH == 3
    regex = re.compile(to_regex(Constraint.json_object()).regex)
    assert regex.fullmatch('{"a":{"b":[1]}}')
    assert regex.fullmatch('{"a": 1, "b": [true, null, "x"], "c": [{"d": 1.5e+3}]}')
    assert regex.fullmatch("{}")
    assert not regex.fullmatch('{"a":{"b":[[1]]}}')
    assert not regex.fullmatch("[1]")
    assert not regex.fullmatch('"text"')


# ------------------------------------------------------------------------ json_schema


def test_json_schema_whitespace_is_bounded_by_the_constraint():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    regex = to_regex(Constraint.json_schema(schema)).regex
    assert accepts(regex, '{"a":1}')
    assert accepts(regex, '{ "a": 1 }')
    assert not accepts(regex, '{"a":  1}')
    wide = to_regex(Constraint.json_schema(schema, whitespace=r"[ \n]*")).regex
    assert accepts(wide, '{\n  "a":  1\n}')


def test_top_level_number_may_have_a_fraction():
    regex = to_regex(Constraint.json_schema({"type": "number", "minimum": 0})).regex
    assert rust_accepts(regex, "1.5")
    assert rust_accepts(regex, "15")
    assert not rust_accepts(regex, "-1")


def test_json_schema_rewrites_are_reported():
    schema = {"type": "object", "properties": {"d": {"type": "string", "format": "datetime"}}}
    result = to_regex(Constraint.json_schema(schema))
    assert result.rewrites == (
        "/properties/d/format: unknown format 'datetime' treated as a plain string "
        "(an annotation: validators do not check it)",
    )


def test_property_names_are_json_escaped():
    schema = {
        "type": "object",
        "properties": {'a"b': {"type": "integer"}, "c\\d": {"type": "integer"}},
        "required": ['a"b', "c\\d"],
    }
    regex = to_regex(Constraint.json_schema(schema)).regex
    assert accepts(regex, '{"a\\"b":1,"c\\\\d":2}')
    assert not accepts(regex, '{"a"b":1,"c\\d":2}')


def test_spliced_leaves_sit_inside_the_structure():
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 1, "maximum": 12},
            "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
        },
        "required": ["n", "code"],
    }
    regex = to_regex(Constraint.json_schema(schema)).regex
    assert "gclm" not in regex
    assert accepts(regex, '{"n":12,"code":"ABC"}')
    assert not accepts(regex, '{"n":13,"code":"ABC"}')
    assert not accepts(regex, '{"n":1,"code":"abc"}')


# ------------------------------------------------------------------ json_regex (a part)


@pytest.mark.parametrize(
    "constraint",
    [Constraint.json_object(), Constraint.json_schema({"type": "object", "required": ["a"]})],
)
def test_json_regex_is_the_unanchored_part_of_to_regex(constraint: Constraint) -> None:
    part = json_regex(constraint).regex
    assert to_regex(constraint).regex == f"(?:{part})$"
    # As one branch of a larger regex (a tool constraint's text branch), in both dialects.
    union = to_regex(Constraint.regex(f"(?:{part})|<call>x")).regex
    assert accepts(union, '{"a": 1}') and accepts(union, "<call>x")
    assert not accepts(union, "hi") and not accepts(union, "<call>")


def test_json_regex_takes_only_json_kinds() -> None:
    with pytest.raises(ValueError, match="JSON constraint"):
        json_regex(Constraint.regex("a"))


@pytest.mark.parametrize(
    "constraint",
    [
        Constraint.regex("x{1000000000}"),
        Constraint.regex("(ab){20000,}c"),
        Constraint.json_schema({"type": "string", "minLength": 1_000_000_000}),
        Constraint.json_schema({"type": "array", "items": {"type": "integer"}, "minItems": 20_000}),
    ],
)
def test_a_huge_required_count_is_a_compile_limit_before_any_automaton(
    constraint: Constraint,
) -> None:
    """Refused while the regex is written (no worker spends its CPU limit on it first)."""
    with pytest.raises(CompileLimitError, match="over gclm's limit of 10,000") as e:
        to_regex(constraint)
    assert e.value.code == "compile_limit"


def test_counts_within_the_limit_and_braces_in_classes_compile() -> None:
    assert rust_accepts(to_regex(Constraint.regex("[{]x{3}")).regex, "{xxx")
    assert to_regex(Constraint.json_schema({"type": "string", "minLength": 300})).regex
