"""The characters a string can start with, for proofs that two string schemas are disjoint.

A pattern anchored at the start (`^\\./.+$`, `^(a|b)`) or a format gclm writes (`uri`:
`http`/`https`/`ftp` URLs) fixes the set of first characters of every non-empty string it
matches. Two string schemas whose sets do not meet share no string but, perhaps, the empty
one. Sets are over-approximations (a class escape takes its widest reading, `.` any
character), so disjoint sets prove disjoint strings; None means "unknown".
"""

from __future__ import annotations

import re._constants as sre
from typing import Any

from gclm.compiler.front.json_schema.patterns import (
    FORMATS,
    _in_ranges,
    _parse_pattern,
    complement_ranges,
    normalize_ranges,
)
from gclm.errors import UnsupportedSchemaError

Ranges = list[tuple[int, int]]
_ALL: Ranges = [(0, 0x10FFFF)]
_NON_ASCII = (0x80, 0x10FFFF)
_REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", sre.MAX_REPEAT))


def pattern_starts(pattern: str) -> Ranges | None:
    """First characters of the strings `pattern` (searched, as JSON Schema does) matches.

    None unless every alternative is anchored with `^` and must match a character there.
    """
    try:
        parsed = list(_parse_pattern(pattern, ""))
    except UnsupportedSchemaError:
        return None
    return _anchored(parsed, 0)


def format_starts(fmt: str) -> Ranges | None:
    """First characters of the non-empty strings gclm writes for `format` (FORMATS)."""
    if fmt not in FORMATS:
        return None
    first, _ = _first(list(_parse_pattern(FORMATS[fmt], "")), 0)
    return first


def node_starts(node: dict[str, Any]) -> Ranges | None:
    """First characters of the non-empty strings a string node generates, or None."""
    if "format" in node:
        return format_starts(node["format"])
    if isinstance(node.get("pattern"), str):
        return pattern_starts(node["pattern"])
    return None


def meets(a: Ranges, b: Ranges) -> bool:
    return any(max(x, y) <= min(x2, y2) for x, x2 in a for y, y2 in b)


def _anchored(items: list[Any], depth: int) -> Ranges | None:
    """`items` must start with `^` (or be an alternation/group whose every branch does)."""
    if not items or depth > 20:
        return None
    op, av = items[0]
    if op is sre.AT and av in (sre.AT_BEGINNING, sre.AT_BEGINNING_STRING):
        first, nullable = _first(items[1:], depth)
        return None if nullable else first
    if op is sre.BRANCH:
        alts = [_anchored(list(b) + items[1:], depth + 1) for b in av[1]]
        return None if any(a is None for a in alts) else normalize_ranges(sum(alts, []))  # type: ignore[arg-type]
    if op is sre.SUBPATTERN and not av[1] and not av[2]:
        return _anchored(list(av[3]) + items[1:], depth + 1)
    return None


def _first(items: list[Any], depth: int) -> tuple[Ranges | None, bool]:
    """(first characters, whether `items` can match the empty string); None: unknown."""
    out: Ranges = []
    for op, av in items:
        first, nullable = _first_item(op, av, depth)
        if first is None:
            return None, True
        out += first
        if not nullable:
            return normalize_ranges(out), False
    return normalize_ranges(out), True


def _first_item(op: Any, av: Any, depth: int) -> tuple[Ranges | None, bool]:
    if depth > 50:
        return None, True
    if op is sre.LITERAL:
        return [(av, av)], False
    if op is sre.NOT_LITERAL:
        return complement_ranges([(av, av)]), False
    if op is sre.ANY:
        return _ALL, False
    if op is sre.IN:
        try:
            ranges = _in_ranges(av, widest=True)
        except ValueError:
            return _ALL, False
        if any(o is sre.CATEGORY for o, _ in av) and av[0][0] is not sre.NEGATE:
            ranges = normalize_ranges([*ranges, _NON_ASCII])  # Python's `re` reads \d, \w wider
        return ranges, False
    if op is sre.AT:
        return [], True  # zero width
    if op is sre.SUBPATTERN:
        return _first(list(av[3]), depth + 1)
    if op is sre.BRANCH:
        alts = [_first(list(b), depth + 1) for b in av[1]]
        if any(f is None for f, _ in alts):
            return None, True
        return normalize_ranges(sum((f for f, _ in alts if f), [])), any(n for _, n in alts)
    if op in _REPEATS:
        first, nullable = _first(list(av[2]), depth + 1)
        return first, nullable or av[0] == 0
    return None, True  # look-around, backreferences: unknown
