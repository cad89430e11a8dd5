"""Regexes for JSON string leaves: ECMA-262 patterns, formats, and literal escaping.

outlines-core 0.2.14 pastes a schema's `pattern` between quotes without JSON-escaping it
(so `.*` can emit a raw `"`), ignores `pattern` when `minLength`/`maxLength` are present,
and some of its `format` regexes can emit invalid JSON (`email` with a quoted local part,
`time` with a lone backslash). gclm builds these leaves itself; `compiler/front/regex.py`
splices them into the regex outlines-core builds for the rest of the schema.

Every regex here is written in the common subset of Rust `regex` and Python `re` syntax
(escapes `\\xHH`, `\\uHHHH`, `\\UHHHHHHHH`; no look-around), so tests can check it with
`re.fullmatch`. A string leaf's regex describes the JSON-encoded text between the quotes.
"""

from __future__ import annotations

import re
import re._constants as sre
import re._parser as sre_parse
from functools import lru_cache
from typing import Any

from outlines_core.json_schema import STRING_INNER

from gclm.compiler.front.json_schema.anchors import anchored_branches
from gclm.compiler.front.json_schema.lengths import ANY_CHARS, fold_lengths, width
from gclm.compiler.front.rust_regex import parse_problem
from gclm.errors import UnsupportedSchemaError, quote

# One JSON string character, encoded, as RFC 8259 allows it: any character but `"`, `\`
# and U+0000..U+001F raw, or an escape. JSON_CHAR_SHORT has the short escapes only; it is
# the one used under a count (`{0,256}`), where `\uXXXX` would add five DFA states per
# counted character (+60% states on a bounded string). JSON_CHAR adds `\uXXXX` for free
# text, leaving out the surrogates: a pair is one character to a validator. outlines-core's
# own STRING_INNER (no `\u`, no raw U+007F..U+009F) is replaced by these in its regexes
# (see `compiler/front/json_schema/regex.py`), so free text and pattern text agree.
OUTLINES_JSON_CHAR = STRING_INNER
JSON_CHAR_SHORT = r'(?:[^"\\\x00-\x1F]|\\["\\/bfnrt])'
JSON_CHAR = (
    r'(?:[^"\\\x00-\x1F]|\\["\\/bfnrt]'
    r"|\\u(?:[0-9a-cA-CefEF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}))"
)
JSON_CHAR_NO_QUOTE = JSON_CHAR.replace('\\\\["', "\\\\[")  # no `\"` (see `string_regex`)

_DATE = (
    r"[12][0-9]{3}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
    r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))"
)
_HOUR_MINUTE = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]"
_TIME = _HOUR_MINUTE + r":[0-5][0-9](?:\.[0-9]{1,6})?(?:Z|[+\-]" + _HOUR_MINUTE + ")"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9\-]{0,60}[A-Za-z0-9])?"
# The last label starts with a letter (an all-numeric top-level domain is refused by FQDN
# checkers), and at most 4 labels of at most 62 characters keep the name under 253.
_TOP_LABEL = r"[A-Za-z](?:[A-Za-z0-9\-]{0,60}[A-Za-z0-9])?"
_HOSTNAME = rf"(?:{_LABEL}\.){{0,3}}{_TOP_LABEL}"
_URI_CHAR = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/]|%[0-9A-Fa-f]{2})"
_QUERY_CHAR = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/?]|%[0-9A-Fa-f]{2})"
_SEGMENT_NC = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=@]|%[0-9A-Fa-f]{2})+"  # no ':' (path-noscheme)
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_URI = (
    rf"(?:https?|ftp)://{_HOSTNAME}(?::[0-9]{{1,5}})?(?:/{_URI_CHAR}*)?(?:\?{_QUERY_CHAR}*)?"
    rf"(?:#{_QUERY_CHAR}*)?"
)
# A relative reference that cannot be read as a scheme or an authority: segments without
# ':' and never two '/' in a row.
_RELATIVE_REF = (
    rf"(?:/?{_SEGMENT_NC}(?:/{_SEGMENT_NC})*/?|/)?(?:\?{_QUERY_CHAR}*)?(?:#{_QUERY_CHAR}*)?"
)
_H16 = r"[0-9a-fA-F]{1,4}"
_IPV6 = "|".join(
    [
        rf"(?:{_H16}:){{7}}{_H16}",
        rf"(?:{_H16}:){{1,7}}:",
        rf"(?:{_H16}:){{1,6}}:{_H16}",
        *(rf"(?:{_H16}:){{1,{7 - n}}}(?::{_H16}){{1,{n}}}" for n in range(2, 7)),
        rf"::(?:{_H16}:){{0,6}}{_H16}",
        "::",
    ]
)
_DURATION_TIME = (
    r"T(?:[0-9]{1,9}H(?:[0-9]{1,9}M)?(?:[0-9]{1,9}S)?|[0-9]{1,9}M(?:[0-9]{1,9}S)?|[0-9]{1,9}S)"
)
_DURATION = (
    r"P(?:[0-9]{1,9}W"
    rf"|[0-9]{{1,9}}Y(?:[0-9]{{1,9}}M)?(?:[0-9]{{1,9}}D)?(?:{_DURATION_TIME})?"
    rf"|[0-9]{{1,9}}M(?:[0-9]{{1,9}}D)?(?:{_DURATION_TIME})?"
    rf"|[0-9]{{1,9}}D(?:{_DURATION_TIME})?"
    rf"|{_DURATION_TIME})"
)
_JSON_POINTER = r"(?:/(?:[^~/]|~[01])*)*"
# format "regex": ECMA-262 patterns (Unicode mode too) that Python's `re` also compiles
# without a warning, so every validator's check passes. Literals are never metacharacters;
# escapes are of syntax characters (`\-` only inside a class: ECMA-262's Unicode mode
# refuses it outside) and of \d \w \s; classes hold literals, escapes and the ranges a-z,
# A-Z and 0-9 (never an unescaped `-`, `[` or `^` past the first); a quantifier follows an
# atom, once, with n < m in `{n,m}`; groups (plain or `(?:`) nest 2 deep, with `|` anywhere.
_RX_LITERAL = r"[A-Za-z0-9 _,:;=@%'!<>#&~/\-]"
_RX_ESCAPE = r"\\[.*+?()\[\]{}|^$\\/dDwWsS]"
_RX_CLASS = r"\[\^?(?:[A-Za-z0-9 _.,:;=@%/]|a-z|A-Z|0-9|\\[\[\]\\\-^.dDwWsS])+\]"
_RX_QUANTIFIER = r"(?:[*+?]|\{[0-9]{1,3},?\}|\{[0-9],[1-9][0-9]{1,2}\})\??"


def _regex_syntax(depth: int) -> str:
    """Alternatives of pieces, with groups nested `depth` deep (see _RX_LITERAL)."""
    group = rf"|\((?:\?:)?{_regex_syntax(depth - 1)}\)" if depth else ""
    piece = rf"(?:(?:{_RX_LITERAL}|\.|{_RX_ESCAPE}|{_RX_CLASS}{group})(?:{_RX_QUANTIFIER})?|\^|\$)"
    return rf"{piece}*(?:\|{piece}*)*"


# Formats gclm enforces. Each is a subset of what RFC 3339 / 3986 / 3987 / 4291 / 5321 /
# 6901 allow, written as patterns (`string_regex` JSON-encodes them), so every string one
# matches passes a format-checking validator; none takes every valid value (see README).
FORMATS: dict[str, str] = {
    "date-time": _DATE + "T" + _TIME,
    "date": _DATE,
    "time": _TIME,
    "duration": _DURATION,
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "email": r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~\-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~\-]+)*@"
    + _LABEL
    + r"(?:\."
    + _LABEL
    + r"){1,3}",
    "uri": _URI,
    "uri-reference": f"(?:{_URI}|{_RELATIVE_REF})",
    # IRIs extend URIs with non-ASCII characters: the ASCII URIs are a subset.
    "iri": _URI,
    "iri-reference": f"(?:{_URI}|{_RELATIVE_REF})",
    "hostname": _HOSTNAME,
    "ipv4": rf"{_OCTET}\.{_OCTET}\.{_OCTET}\.{_OCTET}",
    "ipv6": f"(?:{_IPV6})",
    "json-pointer": _JSON_POINTER,
    # Its integer written without a 0 after its first digit: jsonschema 4.26's checker
    # rejects "406/a" (it reads a 0 followed by a digit as a leading zero).
    "relative-json-pointer": rf"(?:0|[1-9][1-9]{{0,8}})(?:#|{_JSON_POINTER})",
    # An ASCII address is an internationalized one too (RFC 6531 extends RFC 5321's).
    "idn-email": r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~\-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~\-]+)*@"
    + _LABEL
    + r"(?:\."
    + _LABEL
    + r"){1,3}",
    "regex": _regex_syntax(2),
}
# Formats that format-checking validators (Draft 2019-09/2020-12's format vocabulary) check.
# One of these that is not in FORMATS is refused, never ignored: ignoring it would let an
# invalid value through. Any other format is an annotation that no validator checks.
CHECKED_FORMATS = set(FORMATS) | {
    "idn-email",
    "idn-hostname",
    "uri-template",
    "regex",
}

_MAX_CHAR = 0x10FFFF
_NOTHING = r"[^\x00-\U0010FFFF]"
# ECMA-262 classes (JSON Schema patterns are ECMA-262 regexes): ASCII \d and \w, and
# \s with the Unicode spaces and line terminators. Validators differ on \s: Python's `re`
# (the `jsonschema` package) leaves out U+FEFF and adds U+001C-U+001F and U+0085. So a
# pattern's characters are those both readings accept: \s the spaces both call spaces, \S
# (and a class negating \s) none that either calls one.
_ECMA_SPACE = [
    (0x09, 0x0D),
    (0x20, 0x20),
    (0xA0, 0xA0),
    (0x1680, 0x1680),
    (0x2000, 0x200A),
    (0x2028, 0x2029),
    (0x202F, 0x202F),
    (0x205F, 0x205F),
    (0x3000, 0x3000),
    (0xFEFF, 0xFEFF),
]
_SPACE_IN_BOTH = [r for r in _ECMA_SPACE if r != (0xFEFF, 0xFEFF)]
_SPACE_IN_EITHER = [*_ECMA_SPACE, (0x1C, 0x1F), (0x85, 0x85)]
_DIGIT = [(0x30, 0x39)]
_WORD = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
_LINE_TERMINATORS = [(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)]
# Characters JSON must escape that a pattern may still produce, and how. Other control
# characters are left out: their \\u00XX forms would bloat every class for no real use.
_JSON_ESCAPES = {
    0x22: '\\"',
    0x5C: "\\\\",
    0x08: "\\b",
    0x09: "\\t",
    0x0A: "\\n",
    0x0C: "\\f",
    0x0D: "\\r",
}
_RAW_FORBIDDEN = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]


def escape_literal(text: str) -> str:
    """Escape `text` so it matches itself in both Rust `regex` and Python `re` syntax."""
    return "".join(_escape_char(ord(c)) for c in text)


_META = set("\\.+*?()|[]{}^$#&-~")


def _escape_char(cp: int) -> str:
    c = chr(cp)
    if c in _META:
        return "\\" + c
    if 0x20 <= cp < 0x7F or cp >= 0xA0 and c.isprintable():
        return c
    if cp < 0x100:
        return f"\\x{cp:02x}"
    return f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}"


def normalize_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def complement_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out, start = [], 0
    for lo, hi in normalize_ranges(ranges):
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= _MAX_CHAR:
        out.append((start, _MAX_CHAR))
    return out


def minus_ranges(
    ranges: list[tuple[int, int]], removed: list[tuple[int, int]]
) -> list[tuple[int, int]]:
    """The code points of `ranges` not in `removed`, as sorted disjoint ranges."""
    keep = complement_ranges(removed)
    return normalize_ranges(
        [(max(a, c), min(b, d)) for a, b in ranges for c, d in keep if max(a, c) <= min(b, d)]
    )


def char_set_regex(ranges: list[tuple[int, int]], quotes: bool = True) -> str:
    """Regex for one decoded character in `ranges`, as it appears JSON-encoded.

    `quotes=False` leaves out `\\"` (see `string_regex`).
    """
    ranges = normalize_ranges(ranges)
    raw = minus_ranges(ranges, _RAW_FORBIDDEN)
    alternatives = []
    if raw:
        if len(raw) == 1 and raw[0][0] == raw[0][1]:
            alternatives.append(_escape_char(raw[0][0]))
        else:
            body = "".join(
                _escape_char(lo) if lo == hi else f"{_escape_char(lo)}-{_escape_char(hi)}"
                for lo, hi in raw
            )
            alternatives.append(f"[{body}]")
    alternatives += [
        escape_literal(text)
        for cp, text in _JSON_ESCAPES.items()
        if any(lo <= cp <= hi for lo, hi in ranges) and (quotes or cp != 0x22)
    ]
    if not alternatives:
        return _NOTHING
    return alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(alternatives) + ")"


# ---------------------------------------------------------------------------- patterns


def _parse_pattern(pattern: str, pointer: str) -> sre_parse.SubPattern:
    # ECMA-262 named groups are `(?<name>`; Python spells them `(?P<name>`.
    python_pattern = re.sub(r"\(\?<(?![=!])", "(?P<", pattern)
    try:
        parsed = sre_parse.parse(python_pattern)
    except (re.error, OverflowError, RecursionError) as e:
        raise UnsupportedSchemaError(
            "pattern", pointer, f"{quote(pattern)} does not parse: {parse_problem(e)}"
        ) from e
    if parsed.state.flags & ~sre.SRE_FLAG_UNICODE:
        raise UnsupportedSchemaError("pattern", pointer, f"{quote(pattern)} uses inline flags")
    return parsed


def _category_sets() -> dict[Any, tuple[list[tuple[int, int]], list[tuple[int, int]]]]:
    """Each class escape's (narrowest, widest) reading across ECMA-262 and Python's `re`."""
    space = (_SPACE_IN_BOTH, _SPACE_IN_EITHER)
    return {
        sre.CATEGORY_DIGIT: (_DIGIT, _DIGIT),
        sre.CATEGORY_WORD: (_WORD, _WORD),
        sre.CATEGORY_SPACE: space,
        sre.CATEGORY_NOT_DIGIT: (complement_ranges(_DIGIT), complement_ranges(_DIGIT)),
        sre.CATEGORY_NOT_WORD: (complement_ranges(_WORD), complement_ranges(_WORD)),
        sre.CATEGORY_NOT_SPACE: (complement_ranges(space[1]), complement_ranges(space[0])),
    }


_CATEGORY_SETS = _category_sets()


def _in_ranges(items: list[tuple[Any, Any]], widest: bool = False) -> list[tuple[int, int]]:
    """A character class's code points: those both readings take (`widest`: either takes)."""
    ranges: list[tuple[int, int]] = []
    negate = bool(items) and items[0][0] is sre.NEGATE
    for op, av in items:
        if op is sre.NEGATE:
            continue
        elif op is sre.LITERAL:
            ranges.append((av, av))
        elif op is sre.RANGE:
            ranges.append(av)
        elif op is sre.CATEGORY and av in _CATEGORY_SETS:
            # In a negated class an item takes the widest reading, so what is left is
            # outside it in both.
            ranges += _CATEGORY_SETS[av][int(negate != widest)]
        else:
            raise ValueError(f"character class item {op} {av}")
    return complement_ranges(ranges) if negate else normalize_ranges(ranges)


def _emit(items: list[tuple[Any, Any]], pattern: str, pointer: str, quotes: bool = True) -> str:
    """Translate parsed pattern items into a regex over JSON-encoded string text."""
    out = []
    for op, av in items:
        if op is sre.LITERAL:
            out.append(char_set_regex([(av, av)], quotes))
        elif op is sre.NOT_LITERAL:
            out.append(char_set_regex(complement_ranges([(av, av)]), quotes))
        elif op is sre.ANY:
            out.append(char_set_regex(complement_ranges(_LINE_TERMINATORS), quotes))
        elif op is sre.IN:
            try:
                out.append(char_set_regex(_in_ranges(av), quotes))
            except ValueError as e:
                raise UnsupportedSchemaError("pattern", pointer, f"{quote(pattern)}: {e}") from e
        elif op is sre.BRANCH:
            out.append(
                "(?:" + "|".join(_emit(list(b), pattern, pointer, quotes) for b in av[1]) + ")"
            )
        elif op is sre.SUBPATTERN:
            _, add_flags, del_flags, sub = av
            if add_flags or del_flags:
                raise UnsupportedSchemaError(
                    "pattern", pointer, f"{quote(pattern)} uses inline flags"
                )
            out.append("(?:" + _emit(list(sub), pattern, pointer, quotes) + ")")
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
            # Laziness changes which match a search finds, not which strings match.
            lo, hi, sub = av
            count = f"{{{lo},}}" if hi >= sre.MAXREPEAT else f"{{{lo},{hi}}}"
            out.append("(?:" + _emit(list(sub), pattern, pointer, quotes) + ")" + count)
        else:
            what = {
                sre.AT: "an anchor or word boundary inside the pattern",
                sre.ASSERT: "look-around",
                sre.ASSERT_NOT: "look-around",
                sre.GROUPREF: "a backreference",
                sre.GROUPREF_EXISTS: "a conditional group",
            }.get(op, str(op).lower())
            raise UnsupportedSchemaError("pattern", pointer, f"{quote(pattern)} uses {what}")
    return "".join(out)


def pattern_regex(
    pattern: str,
    pointer: str,
    min_length: int = 0,
    max_length: int | None = None,
    quotes: bool = True,
) -> str:
    """Regex for the JSON-encoded text of strings that contain a match of `pattern` (see
    `_pattern_regex`). A translation is kept: a schema whose `$ref`s repeat a pattern or a
    format in thousands of places translates it once (the pointer only names errors).

    Raises:
        UnsupportedSchemaError: as `_pattern_regex`, naming `pointer`.
    """
    try:
        return _kept_pattern_regex(pattern, min_length, max_length, quotes)
    except UnsupportedSchemaError:
        return _pattern_regex(pattern, pointer, min_length, max_length, quotes)  # raises


@lru_cache(maxsize=1024)
def _kept_pattern_regex(pattern: str, min_length: int, max_length: int | None, quotes: bool) -> str:
    return _pattern_regex(pattern, "", min_length, max_length, quotes)


def _pattern_regex(
    pattern: str, pointer: str, min_length: int, max_length: int | None, quotes: bool
) -> str:
    """Regex for the JSON-encoded text of strings that contain a match of `pattern`.

    A JSON Schema pattern is an unanchored search: `ab` accepts `xaby`. Each unanchored
    side is padded with any JSON characters; `^...$` makes the pattern the whole string.
    Length bounds are folded into the pattern when they can be (see `lengths.py`); a
    branch of an alternation they cannot be folded into is left out.
    `quotes=False` generates no `"` inside the string (see `string_regex`).

    Raises:
        UnsupportedSchemaError: look-around, backreferences, inline flags, anchors inside
            the pattern, or length bounds that cannot be combined with it.
    """
    branches, failures = [], []
    lengths_needed = min_length > 0 or max_length is not None
    for start, body, end in anchored_branches(list(_parse_pattern(pattern, pointer))):
        if lengths_needed and not (max_length is None and width(body)[0] >= min_length):
            # The unanchored sides become explicit repeats the length bounds can narrow.
            body = ([] if start else [ANY_CHARS]) + body + ([] if end else [ANY_CHARS])
            start = end = True
            try:
                body = fold_lengths(body, min_length, max_length, pattern, pointer)
            except UnsupportedSchemaError as e:
                failures.append(e)  # this branch is left out; the others may still do
                continue
        text = _emit(body, pattern, pointer, quotes)
        pad = JSON_CHAR if quotes else JSON_CHAR_NO_QUOTE
        branches.append(("" if start else f"{pad}*") + text + ("" if end else f"{pad}*"))
    if not branches and not failures:
        raise UnsupportedSchemaError("pattern", pointer, f"{quote(pattern)} matches no string")
    if not branches:
        raise failures[0]
    return branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"


def string_regex(node: dict[str, Any], pointer: str, top_level: bool = False) -> str | None:
    """Regex for a normalised string node with a `pattern` or `format`, quotes included.

    A format is enforced (validators check it), so a format with a pattern, or with length
    bounds that cannot be folded into it, is refused rather than ignored. Returns None for
    nodes outlines-core handles itself (plain strings, length bounds), except at the top level.

    `top_level`: the string is the whole output. outlines-core builds an unanchored DFA as
    well, and there every `\\"` inside a counted repetition may start a new match: its
    size doubles with each count (`{0,16}` takes seconds, `{0,32}` never finishes). A
    top-level string is therefore generated without `"` in it.

    Raises:
        UnsupportedSchemaError: a pattern this module cannot translate or fold lengths into,
            or a format with a pattern or with such lengths.
    """
    min_len, max_len = node.get("minLength", 0), node.get("maxLength")
    quotes = not top_level
    if "pattern" in node and "format" in node:
        raise UnsupportedSchemaError(
            "format",
            pointer,
            f"format {quote(node['format'])} together with a pattern: one regex cannot enforce "
            "both; keep one of them",
        )
    if "pattern" in node:
        return '"' + pattern_regex(node["pattern"], pointer, min_len, max_len, quotes) + '"'
    if "format" in node:
        fmt = f"^(?:{FORMATS[node['format']]})$"
        try:
            return '"' + pattern_regex(fmt, pointer, min_len, max_len, quotes) + '"'
        except UnsupportedSchemaError as e:
            raise UnsupportedSchemaError(
                "format",
                pointer,
                f"format {quote(node['format'])} cannot be combined with minLength/maxLength "
                "in one regex; drop the length bounds or the format",
            ) from e
    if top_level:
        count = f"{{{min_len},{'' if max_len is None else max_len}}}"
        char = JSON_CHAR_NO_QUOTE if max_len is None else JSON_CHAR_SHORT.replace('\\\\["', "\\\\[")
        return f'"{char}{count}"'
    return None
