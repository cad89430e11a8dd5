"""`minLength`/`maxLength` folded into a parsed pattern: a subset of their intersection.

A regex cannot intersect two arbitrary languages, but a pattern built from pieces of known
width and repeats of fixed-width items (`^([a-z0-9-]+):([a-z0-9.-]+)$`, `[0-9]{10}`) can
have its repeat counts narrowed until every match has an allowed length. The result
generates only strings the pattern and the bounds both accept; some such strings may be
lost (the counts are shared out in order), which is the price of a single regex.
"""

from __future__ import annotations

import math
import re._constants as sre
import re._parser as sre_parse
from typing import Any

from gclm.errors import UnsupportedSchemaError, quote

Items = list[tuple[Any, Any]]
MAX_SPLIT = 16  # alternatives distributed to fold length bounds into each
# A repeat capped to fit a maxLength (see `_capped`) keeps at most this many: counted
# repeats are automaton states, nested ones multiply.
MAX_CAP = 16
# What an unanchored side of a pattern may hold: any characters (JSON-encoded by _emit).
ANY_CHARS: tuple[Any, Any] = (
    sre.MAX_REPEAT,
    (
        0,
        sre.MAXREPEAT,
        sre_parse.SubPattern(sre_parse.State(), [(sre.IN, [(sre.RANGE, (0, 0x10FFFF))])]),
    ),
)


def width(items: Items) -> tuple[int, int | None]:
    """Fewest and most characters a match of `items` has (None: unbounded)."""
    lo, hi = sre_parse.SubPattern(sre_parse.State(), items).getwidth()
    return lo, (None if hi >= sre.MAXREPEAT - 1 else hi)


def _pieces(items: Items) -> Items:
    """`items` with plain groups inlined, so that the repeats inside them can be narrowed."""
    out: Items = []
    for op, av in items:
        if op is sre.SUBPATTERN and not av[1] and not av[2]:
            out += _pieces(list(av[3]))
        elif (inner := _optional_repeat(op, av)) is not None:
            out.append(inner)
        else:
            out.append((op, av))
    return out


def _optional_repeat(op: Any, av: Any) -> tuple[Any, Any] | None:
    """`(x{a,b})?` with a <= 1 as the same language `x{0,b}`, a repeat that can be narrowed."""
    if op not in (sre.MAX_REPEAT, sre.MIN_REPEAT) or av[:2] != (0, 1):
        return None
    inner = list(av[2])
    while len(inner) == 1 and inner[0][0] is sre.SUBPATTERN and not any(inner[0][1][1:3]):
        inner = list(inner[0][1][3])
    if len(inner) != 1 or inner[0][0] not in (sre.MAX_REPEAT, sre.MIN_REPEAT):
        return None
    lo, hi, sub = inner[0][1]
    return (inner[0][0], (0, hi, sub)) if lo <= 1 else None


def _step(item: tuple[Any, Any]) -> int | None:
    """The width of one repetition when `item` is a repeat of a fixed-width item, else None."""
    op, av = item
    if op not in (sre.MAX_REPEAT, sre.MIN_REPEAT):
        return None
    lo, hi = width(list(av[2]))
    return lo if lo == hi and lo else None


def fold_lengths(
    body: Items, min_len: int, max_len: int | None, pattern: str, pointer: str
) -> Items:
    """Narrow the repeats of an anchored pattern body so each match is min_len..max_len long.

    Where the body as a whole cannot be narrowed, its first alternation is distributed
    (`^(a|b+c)$` is `^a$|^b+c$`) and each alternative narrowed on its own; the ones that
    cannot be are left out (at most MAX_SPLIT alternatives in all).

    Raises:
        UnsupportedSchemaError: as `_fold`, when no alternative can be narrowed.
    """
    try:
        return _fold_split(body, min_len, max_len, pattern, pointer, [MAX_SPLIT])
    except UnsupportedSchemaError as e:
        capped = _capped(body, max_len) if max_len is not None else None
        if capped is None:
            raise
        try:  # every repeat is bounded now, so the counts can be narrowed for minLength too
            return _fold(capped, min_len, max_len, pattern, pointer)
        except UnsupportedSchemaError:
            raise e from None


def _capped(body: Items, max_len: int) -> Items | None:
    """`body` with each repeat `{lo,hi}` cut to `{lo,min(hi, max(lo, k))}`, every match at most
    `max_len` long, for the largest such k up to MAX_CAP; None if even k = 0 is too long.

    A last resort for bodies `_fold` cannot narrow (an unbounded group of unbounded parts,
    as in a format's `[a-z]+(?:\\.[a-z]+)*`): a subset of the pattern, of bounded length.
    """
    shortest = width(_cap(body, 0))[1]
    if shortest is None or shortest > max_len:
        return None
    lo, hi = 0, MAX_CAP  # the largest k that fits lies in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if (width(_cap(body, mid))[1] or 0) <= max_len:
            lo = mid
        else:
            hi = mid - 1
    return _cap(body, lo)


def _cap(items: Items, k: int) -> Items:
    """`items` with every repeat's maximum cut to max(its minimum, k), at any depth."""

    def sub(x: Any) -> Any:
        return sre_parse.SubPattern(sre_parse.State(), _cap(list(x), k))

    out: Items = []
    for op, av in items:
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
            lo, hi, inner = av
            hi = min(hi, max(lo, k))
            out.append((op, (lo, hi, sub(inner))))
        elif op is sre.SUBPATTERN:
            out.append((op, (*av[:3], sub(av[3]))))
        elif op is sre.BRANCH:
            out.append((op, (av[0], [sub(b) for b in av[1]])))
        else:
            out.append((op, av))
    return out


def _fold_split(
    body: Items, min_len: int, max_len: int | None, pattern: str, pointer: str, left: list[int]
) -> Items:
    try:
        return _fold(body, min_len, max_len, pattern, pointer)
    except UnsupportedSchemaError as e:
        pieces = _pieces(body)
        at = next((i for i, (op, _) in enumerate(pieces) if op is sre.BRANCH), None)
        if at is None or left[0] < len(pieces[at][1][1]):
            raise
        left[0] -= len(pieces[at][1][1])
        folded = []
        for alternative in pieces[at][1][1]:
            split = pieces[:at] + list(alternative) + pieces[at + 1 :]
            try:
                folded.append(_fold_split(split, min_len, max_len, pattern, pointer, left))
            except UnsupportedSchemaError:
                continue
        if not folded:
            raise e from None
        subs = [sre_parse.SubPattern(sre_parse.State(), f) for f in folded]
        return [(sre.BRANCH, (None, subs))]


def _fold(body: Items, min_len: int, max_len: int | None, pattern: str, pointer: str) -> Items:
    """Narrow the repeats of an anchored pattern body so each match is min_len..max_len long.

    Raises:
        UnsupportedSchemaError: a piece of unbounded width that is not a repeat of a
            fixed-width item (with a maxLength), or no counts that satisfy the bounds.
    """
    lo, hi = width(body)
    if lo >= min_len and (max_len is None or hi is not None and hi <= max_len):
        return body
    pieces = _pieces(body)
    steps = [_step(p) for p in pieces]
    fixed = [width([p]) for p, s in zip(pieces, steps, strict=True) if s is None]
    if max_len is not None and any(h is None for _, h in fixed):
        raise UnsupportedSchemaError(
            "pattern",
            pointer,
            f"{quote(pattern)} cannot be combined with minLength/maxLength in one regex",
        )
    counts = {i: list(pieces[i][1][:2]) for i, s in enumerate(steps) if s is not None}
    if max_len is not None:
        budget = (
            max_len
            - sum(h or 0 for _, h in fixed)
            - sum(c[0] * steps[i] for i, c in counts.items())
        )
        if budget < 0:
            _impossible(pattern, pointer)
        for k, (i, c) in enumerate(counts.items()):
            share = budget // (len(counts) - k)  # shared out evenly, in order
            extra = min(c[1] - c[0], share // steps[i])
            c[1] = c[0] + extra
            budget -= extra * steps[i]
    deficit = min_len - sum(lo for lo, _ in fixed) - sum(c[0] * steps[i] for i, c in counts.items())
    for i, c in counts.items():
        if deficit <= 0:
            break
        more = min(c[1] - c[0], math.ceil(deficit / steps[i]))
        c[0] += more
        deficit -= more * steps[i]
    if deficit > 0:
        _impossible(pattern, pointer)
    return [(p[0], (*counts[i], p[1][2])) if i in counts else p for i, p in enumerate(pieces)]


def _impossible(pattern: str, pointer: str) -> None:
    raise UnsupportedSchemaError(
        "pattern",
        pointer,
        f"no string matching {quote(pattern)} has the length minLength/maxLength require",
    )
