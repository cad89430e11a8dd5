"""ECMA-262 patterns and formats as regexes over JSON-encoded string text."""

from __future__ import annotations

import json
import re
from datetime import date, datetime

import numpy as np
import pytest

from gclm.compiler.front.json_schema.patterns import (
    FORMATS,
    escape_literal,
    pattern_regex,
    string_regex,
)
from gclm.errors import UnsupportedSchemaError


def encoded(value: str) -> str:
    """The text between the quotes of `value` as JSON."""
    return json.dumps(value, ensure_ascii=False)[1:-1]


def matches(pattern: str, value: str, **lengths) -> bool:
    return re.fullmatch(pattern_regex(pattern, "", **lengths), encoded(value)) is not None


def test_escape_literal_round_trips():
    text = "a.b(c)|d[e]{f}^$*+?\\-&~# \"'\t é日本\U0001f600"
    assert re.fullmatch(escape_literal(text), text)
    assert not re.fullmatch(escape_literal("a.b"), "axb")


def test_ecma_classes_are_ascii():
    assert matches(r"^\d+$", "123")
    assert not matches(r"^\d+$", "١٢٣")  # Arabic-Indic digits are \d in Python, not in ECMA
    assert matches(r"^\w+$", "a_1")
    assert not matches(r"^\w+$", "é")


def test_negated_class_keeps_escapes_json_valid():
    assert matches("^[^@]+$", 'quote " and \\ backslash')
    assert matches("^[^@]+$", "line\nbreak")
    assert not matches("^[^@]+$", "a@b")


def test_dot_excludes_line_terminators():
    assert matches("^a.c$", 'a"c')
    assert not matches("^a.c$", "a\nc")


def test_lazy_and_counted_repeats():
    assert matches("^a{2,3}?b$", "aab")
    assert not matches("^a{2,3}?b$", "ab")


def test_named_group_in_ecma_spelling():
    assert matches("^(?<year>[0-9]{4})$", "2024")


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("^a(?!b)", "look-around"),
        (r"^(a)\1$", "backreference"),
        ("a^b", "anchor"),
        ("(?i)a", "inline flags"),
        (r"\p{L}", "does not parse"),
    ],
)
def test_unsupported_pattern_features(pattern, reason):
    with pytest.raises(UnsupportedSchemaError) as e:
        pattern_regex(pattern, "/properties/p")
    assert e.value.keyword == "pattern" and e.value.pointer == "/properties/p"
    assert reason in e.value.message


def test_lengths_fold_into_a_single_repeat():
    assert matches("^[a-z]+$", "abc", min_length=2, max_length=3)
    assert not matches("^[a-z]+$", "abcd", min_length=2, max_length=3)
    assert not matches("^[a-z]+$", "a", min_length=2, max_length=3)
    assert matches("^x[0-9]*$", "x12", max_length=3)
    assert not matches("^x[0-9]*$", "x123", max_length=3)


def test_lengths_implied_by_the_pattern_are_dropped():
    assert matches("^[0-9]{4}$", "2024", min_length=1, max_length=10)


VALID_FORMATS = {
    "date-time": ["2024-02-28T13:45:00Z", "1999-12-31T23:59:59.123+05:30"],
    "date": ["2024-02-28", "2023-11-30"],
    "time": ["13:45:00Z", "00:00:00.5-08:00"],
    "uuid": ["123e4567-e89b-12d3-a456-426614174000"],
    "email": ["a.b+c@example.co.uk"],
    "uri": ["https://example.com/a/b?x=1&y=%20", "ftp://host:21/"],
    "hostname": ["example.com", "a-b.c", "localhost"],
    "ipv4": ["192.168.0.1", "255.255.255.255"],
    "ipv6": ["::1", "::", "2001:db8::8a2e:370:7334", "fe80:0:0:0:0:0:0:1", "1:2:3:4:5:6:7::"],
    "duration": ["P1D", "PT1H30M", "P1Y2M3DT4H5M6S", "P2W", "PT0S"],
    "uri-reference": ["https://example.com/x#top", "a/b?c=d", "/root", "", "#frag", "../up"],
    "iri": ["https://example.com/a"],
    "iri-reference": ["docs/index.html"],
    "json-pointer": ["", "/a/b", "/a~1b/~0", "/é"],
    "relative-json-pointer": ["0", "1/a", "2#"],
    "idn-email": ["a.b+c@example.co.uk"],
    "regex": [
        "",
        "abc",
        "id: 42, name=x/y",
        "^[a-zA-Z0-9_]{3,16}$",
        "^(?:[a-z]+|\\d{2,})?-x*?$",
        "(a|b(c|[^\\]]))+",
    ],
}

INVALID_FORMATS = {
    "ipv6": ["1:2:3:4:5:6:7:8:9", "1::2::3", ":1", "12345::", "::g"],
    "duration": ["P", "PT", "P1DT", "1D", "P1H"],
    "uri-reference": ["//host/a", "a:b c", "http://x y"],
    "iri": ["not an iri", "http://exa mple.com/é"],
    "hostname": ["-a.com", "a..b", "1.2.3.4", "a" * 64],
    "json-pointer": ["a", "/~2"],
    # jsonschema 4.26's checker reads a 0 after a digit as a leading zero ("406/a", "10#").
    "relative-json-pointer": ["01", "-1", "/a", "406/a", "10#"],
    "idn-email": ["no-at-sign"],
    # Each an error in Python's `re` or in ECMA-262's Unicode mode (test below), then two
    # valid ones the format does not write: a look-ahead, groups nested 3 deep.
    "regex": ["a(", "[x", "a**", "^*", "{", "x{3,2}", "\\-", "[]", "\\1", "(?=a)", "((()))"],
}


@pytest.mark.parametrize("fmt", sorted(INVALID_FORMATS))
def test_formats_reject_invalid_values(fmt):
    regex = string_regex({"type": "string", "format": fmt}, "")
    for value in INVALID_FORMATS[fmt]:
        assert not re.fullmatch(regex, json.dumps(value, ensure_ascii=False)), value


def test_ipv6_values_parse():
    import ipaddress

    for value in VALID_FORMATS["ipv6"]:
        ipaddress.IPv6Address(value)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_formats_accept_typical_values(fmt):
    regex = string_regex({"type": "string", "format": fmt}, "")
    for value in VALID_FORMATS[fmt]:
        assert re.fullmatch(regex, json.dumps(value, ensure_ascii=False)), value


def test_format_values_parse():
    regex = re.compile(string_regex({"type": "string", "format": "date"}, ""))
    assert not regex.fullmatch('"2023-02-29"')  # also never generated: Feb 29 is left out
    assert date.fromisoformat("2024-02-28")
    dt = re.compile(string_regex({"type": "string", "format": "date-time"}, ""))
    assert not dt.fullmatch('"2024-02-28T13:45:00"')  # RFC 3339 needs an offset
    assert datetime.fromisoformat("2024-02-28T13:45:00+00:00")


def test_format_with_a_pattern_is_refused_not_ignored():
    with pytest.raises(UnsupportedSchemaError) as e:
        string_regex({"type": "string", "pattern": "^x$", "format": "date"}, "/p")
    assert e.value.keyword == "format" and "/p" in e.value.message


def test_format_with_unfoldable_lengths_is_refused_not_ignored():
    with pytest.raises(UnsupportedSchemaError) as e:
        # No email is under 5 characters ("a@b.c"); a longer bound is met by capping the
        # format's repeats (test_lengths_capped.py).
        string_regex({"type": "string", "format": "email", "maxLength": 4}, "/e")
    assert e.value.keyword == "format" and "minLength/maxLength" in e.value.message
    # A bound the format already implies is kept.
    regex = string_regex({"type": "string", "format": "date", "maxLength": 10}, "")
    assert re.fullmatch(regex, '"2024-01-31"')


def _samples(regex: str, count: int, seed: int) -> list[str]:
    """`count` random texts of `regex`'s byte DFA: random bytes for up to 60 steps, then
    the shortest way to acceptance."""
    import random

    from gclm.compiler.grown.byte_bounds import byte_bounds
    from gclm.compiler.whole.byte_dfa import byte_dfa

    dfa = byte_dfa(regex)
    distance, _ = byte_bounds(dfa, np.ones(256, dtype=bool))
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        state, out, free = 0, bytearray(), rng.randrange(60)
        while len(out) < free or not dfa.accepting[state]:
            live = [b for b in range(256) if dfa.next[state, dfa.columns[b]] >= 0]
            if len(out) >= free:  # on to acceptance
                live = [
                    b for b in live if distance[dfa.next[state, dfa.columns[b]]] < distance[state]
                ]
            elif not live:
                break
            byte = rng.choice(live)
            out.append(byte)
            state = int(dfa.next[state, dfa.columns[byte]])
        assert dfa.accepting[state]
        texts.append(out.decode())
    return texts


def test_format_regex_values_compile_in_python_and_ecma_262():
    """Every value the format generates is a regex Python's `re` compiles without a warning
    and, where node is installed, one JavaScript's RegExp takes with and without the `u`
    flag (validators check `format: regex` with one of the two)."""
    import shutil
    import subprocess
    import warnings

    import jsonschema

    values = [json.loads(t) for t in _samples(string_regex({"format": "regex"}, ""), 400, 7)]
    assert len(set(values)) > 300
    assert any("(" in v for v in values) and any("[" in v for v in values)
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for value in values:
            re.compile(value)
            jsonschema.validate(value, {"format": "regex"}, format_checker=checker)
    node = shutil.which("node")
    if node is None:
        return
    script = (
        "const vs = JSON.parse(require('fs').readFileSync(0, 'utf8')); const bad = [];"
        "for (const v of vs) { for (const f of ['', 'u']) {"
        " try { new RegExp(v, f); } catch (e) { bad.push([v, f, String(e)]); } } }"
        "console.log(JSON.stringify(bad));"
    )
    run = subprocess.run(
        [node, "-e", script],
        input=json.dumps(values),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert json.loads(run.stdout) == []


@pytest.mark.skipif(not __import__("shutil").which("node"), reason="node is not installed")
def test_format_regex_rejects_what_ecma_262_refuses():
    """The invalid values above are refused by JavaScript too (so the test list is right)."""
    import subprocess

    values = INVALID_FORMATS["regex"][:-2]
    script = (
        "const vs = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
        "console.log(JSON.stringify(vs.map(v => { try { new RegExp(v, 'u'); return true; }"
        " catch (e) { return false; } })));"
    )
    run = subprocess.run(
        ["node", "-e", script],
        input=json.dumps(values),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    python_ok = []
    for v in values:
        try:
            re.compile(v)
            python_ok.append(True)
        except re.error:
            python_ok.append(False)
    assert not any(js and py for js, py in zip(json.loads(run.stdout), python_ok, strict=True)), (
        values
    )
