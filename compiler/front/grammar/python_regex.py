"""A Lark regex terminal (Python `re` syntax and flags) as a Rust `regex` that matches a
subset of the same strings.

Lark matches its terminals with Python's `re`; outlines-core compiles Rust `regex`. The
pattern is parsed by Python's own parser and written back with explicit character sets, so
the two engines cannot read a class differently: `\\d`, `\\w` and `\\s` become their ASCII
part (a subset of what `re` matches), a negated class leaves out everything `re` could
count in it, and the `i` flag lists each cased character's variants that `re` itself
matches. Laziness (`*?`) changes which match a search finds, not which strings match, so it
is dropped. Anchors, look-around, backreferences, conditionals, atomic groups and
possessive repeats are refused.
"""

from __future__ import annotations

import _sre
import functools
import re
import re._constants as sre
import re._parser as sre_parse
from typing import Any

from gclm.compiler.front.json_schema.patterns import (
    complement_ranges,
    escape_literal,
    minus_ranges,
    normalize_ranges,
)
from gclm.compiler.front.rust_regex import parse_problem

_MAX_CHAR = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)
_FLAGS = {"i": re.IGNORECASE, "s": re.DOTALL, "m": re.MULTILINE, "x": re.VERBOSE, "u": 0}

Ranges = list[tuple[int, int]]


class RegexProblem(ValueError):
    """Why a regex cannot be translated (the caller adds the line and the fix)."""


def translate(source: str, flags: str = "") -> tuple[str, bool]:
    """(Rust regex, matches the empty string) for the Python regex `source` with Lark's
    `flags` (letters of "imsux").

    Raises:
        RegexProblem: a construct outside what a DFA can hold, or a syntax error.
    """
    bits = 0
    for letter in flags:
        if letter not in _FLAGS:
            raise RegexProblem(f"the regex flag {letter!r} is not one of i, m, s, u, x")
        bits |= _FLAGS[letter]
    try:
        parsed = sre_parse.parse(source, bits)
    except (re.error, OverflowError, RecursionError) as e:
        raise RegexProblem(f"it does not parse: {parse_problem(e)}") from e
    state = parsed.state.flags
    text = _emit(list(parsed), bool(state & re.IGNORECASE), bool(state & re.DOTALL))
    try:
        empty = re.fullmatch(source, "", bits) is not None
    except re.error:  # pragma: no cover - it parsed above
        empty = False
    return text, empty


def _emit(items: list[tuple[Any, Any]], icase: bool, dotall: bool) -> str:
    out = []
    for op, av in items:
        if op is sre.LITERAL:
            out.append(_set_regex(_with_case([(av, av)], False, icase)))
        elif op is sre.NOT_LITERAL:
            out.append(_set_regex(_with_case(complement_ranges([(av, av)]), True, icase)))
        elif op is sre.ANY:
            out.append(_set_regex(complement_ranges([] if dotall else [(0x0A, 0x0A)])))
        elif op is sre.IN:
            negate = bool(av) and av[0][0] is sre.NEGATE
            out.append(_set_regex(_with_case(_in_ranges(av, negate), negate, icase)))
        elif op is sre.BRANCH:
            out.append("(?:" + "|".join(_emit(list(b), icase, dotall) for b in av[1]) + ")")
        elif op is sre.SUBPATTERN:
            _, add, remove, sub = av
            sub_icase = (icase or bool(add & re.IGNORECASE)) and not remove & re.IGNORECASE
            sub_dotall = (dotall or bool(add & re.DOTALL)) and not remove & re.DOTALL
            out.append("(?:" + _emit(list(sub), sub_icase, sub_dotall) + ")")
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
            low, high, sub = av
            count = f"{{{low},}}" if high >= sre.MAXREPEAT else f"{{{low},{high}}}"
            out.append("(?:" + _emit(list(sub), icase, dotall) + ")" + count)
        else:
            what = {
                sre.AT: "an anchor or word boundary (a terminal already matches a whole token)",
                sre.ASSERT: "look-around",
                sre.ASSERT_NOT: "look-around",
                sre.GROUPREF: "a backreference",
                sre.GROUPREF_EXISTS: "a conditional group",
            }.get(op, str(op).lower().replace("_", " "))
            raise RegexProblem(f"it uses {what}, which a DFA cannot hold")
    return "".join(out)


# ---------------------------------------------------------------------------- classes


def _in_ranges(items: list[tuple[Any, Any]], negate: bool) -> Ranges:
    """A class's characters, before its negation and before case folding: each class
    escape at its narrowest reading (ASCII) when taken, its widest (Python's Unicode one)
    when the class is negated, so what is generated is in the class for `re`."""
    ranges: Ranges = []
    for op, av in items:
        if op is sre.NEGATE:
            continue
        if op is sre.LITERAL:
            ranges.append((av, av))
        elif op is sre.RANGE:
            ranges.append(av)
        elif op is sre.CATEGORY:
            narrow, wide = _category(av)
            ranges += wide if negate else narrow
        else:  # pragma: no cover - sre's class items are the ones above
            raise RegexProblem(f"a character class item {op}")
    return complement_ranges(ranges) if negate else normalize_ranges(ranges)


def _category(code: Any) -> tuple[Ranges, Ranges]:
    """(narrowest, widest) characters of a class escape, positive or negated."""
    ascii_sets = {
        sre.CATEGORY_DIGIT: [(0x30, 0x39)],
        sre.CATEGORY_WORD: [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
        sre.CATEGORY_SPACE: [(0x09, 0x0D), (0x20, 0x20)],
    }
    positive = {
        sre.CATEGORY_NOT_DIGIT: sre.CATEGORY_DIGIT,
        sre.CATEGORY_NOT_WORD: sre.CATEGORY_WORD,
        sre.CATEGORY_NOT_SPACE: sre.CATEGORY_SPACE,
    }
    if code in ascii_sets:
        return ascii_sets[code], _python_set(code)
    base = positive[code]
    return complement_ranges(_python_set(base)), complement_ranges(ascii_sets[base])


@functools.cache
def _python_set(code: Any) -> Ranges:
    """The characters Python's `re` counts in `\\d`, `\\w` or `\\s` (Unicode reading)."""
    test = {
        sre.CATEGORY_DIGIT: re.compile(r"\d"),
        sre.CATEGORY_WORD: re.compile(r"\w"),
        sre.CATEGORY_SPACE: re.compile(r"\s"),
    }[code].fullmatch
    return _ranges_of(cp for cp in range(_MAX_CHAR + 1) if test(chr(cp)))


def _with_case(ranges: Ranges, negate: bool, icase: bool) -> Ranges:
    """`ranges` (a class already negated when `negate`) under the `i` flag: the cased
    characters are those Python's `re` matches with the class and the flag."""
    if not icase:
        return ranges
    if negate:
        python = re.compile("[^" + _class_body(complement_ranges(ranges)) + "]", re.IGNORECASE)
    else:
        python = re.compile("[" + _class_body(ranges) + "]", re.IGNORECASE)
    cased = _cased()
    kept = [r for r in minus_ranges(ranges, cased)]
    kept += [(cp, cp) for lo, hi in cased for cp in range(lo, hi + 1) if python.fullmatch(chr(cp))]
    return normalize_ranges(kept)


@functools.cache
def _cased() -> Ranges:
    """Every character case folding can touch: one with another case, or another's case."""
    found: set[int] = set()
    for cp in range(_CASED_END):
        c = chr(cp)
        variants = {c.lower(), c.upper(), c.casefold(), c.title()}
        if variants != {c}:
            found.add(cp)
            found.update(ord(v) for v in variants if len(v) == 1)
    return _ranges_of(sorted(found))


def _ranges_of(codes: Any) -> Ranges:
    out: Ranges = []
    for cp in codes:
        if out and out[-1][1] == cp - 1:
            out[-1] = (out[-1][0], cp)
        else:
            out.append((cp, cp))
    return out


NOTHING = r"[^\x00-\U0010FFFF]"
# No character at or past this has another case (the last cased block, Adlam, ends at
# U+1E95F), nor is one another's case.
_CASED_END = 0x1F000


def _class_body(ranges: Ranges) -> str:
    return "".join(
        escape_literal(chr(lo))
        if lo == hi
        else f"{escape_literal(chr(lo))}-{escape_literal(chr(hi))}"
        for lo, hi in ranges
    )


def _set_regex(ranges: Ranges) -> str:
    """One character from `ranges` (surrogates left out: no UTF-8 text holds one)."""
    ranges = minus_ranges(ranges, [_SURROGATES])
    if not ranges:
        return NOTHING
    if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
        return escape_literal(chr(ranges[0][0]))
    return f"[{_class_body(ranges)}]"


def literal_regex(text: str, ignore_case: bool) -> str:
    """A Lark string literal: `text` itself, or with the `i` flag each character's case
    variants that Python's `re` matches."""
    if not ignore_case:
        return escape_literal(text)
    return "".join(_case_variants(c) for c in text)


@functools.lru_cache(maxsize=4096)
def _case_variants(char: str) -> str:
    """One character under the `i` flag: the characters Python's `re` matches with it,
    looked for among those case mappings connect it to (`_case_family`), not among every
    cased character, which took 1.4 ms a character."""
    python = re.compile(escape_literal(char), re.IGNORECASE).fullmatch
    found = sorted(cp for cp in _case_family(ord(char)) if python(chr(cp)))
    return _set_regex(normalize_ranges([(cp, cp) for cp in found] or [(ord(char), ord(char))]))


def _case_family(cp: int) -> frozenset[int]:
    """The characters that lower-, upper-, title-casing and case folding connect to `cp`,
    through any chain of them (`K`, `k` and the Kelvin sign are one family)."""
    return _case_families().get(cp, frozenset((cp,)))


try:
    from re._casefix import _EXTRA_CASES
except ImportError:  # pragma: no cover - CPython 3.11+ has it
    _EXTRA_CASES = {}
# CPython's own simple case mappings, which its `re` uses (absent elsewhere: str's then).
_SIMPLE_CASE = [f for f in (getattr(_sre, "unicode_tolower", None),
                            getattr(_sre, "unicode_toupper", None)) if f is not None]  # fmt: skip


@functools.cache
def _case_families() -> dict[int, frozenset[int]]:
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        while parent.get(x, x) != x:
            parent[x] = parent.get(parent[x], parent[x])
            x = parent[x]
        return x

    for lo, hi in _cased():
        for cp in range(lo, hi + 1):
            c = chr(cp)
            variants = [ord(v) for v in (c.lower(), c.upper(), c.casefold(), c.title())
                        if len(v) == 1]  # fmt: skip
            # `re` lowers by the simple mapping (U+0130 is `i` to it, "i̇" to str.lower).
            variants += [simple(cp) for simple in _SIMPLE_CASE]
            for variant in variants:
                a, b = find(cp), find(variant)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    for lower, others in _EXTRA_CASES.items():  # `re`'s own equivalences (U+0390, U+1FD3)
        for other in others:
            a, b = find(lower), find(other)
            if a != b:
                parent[max(a, b)] = min(a, b)
    families: dict[int, set[int]] = {}
    for cp in list(parent) + [v for v in parent.values()]:
        families.setdefault(find(cp), set()).add(cp)
    return {cp: frozenset(members) for members in families.values() for cp in members}


def range_regex(low: str, high: str) -> str:
    """A Lark range `"a".."z"`."""
    return _set_regex([(ord(low), ord(high))])
