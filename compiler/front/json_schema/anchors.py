"""A parsed pattern's anchors: per alternative, anchored at each end or not, and `$` inside.

A JSON Schema pattern is searched for, so `^` and `$` at the edges of each top-level
alternative say whether that side of the string is free (`^$|^\\+?[0-9]{9,20}$`).
`$` inside a pattern (`^(a|b$)c?`, `^(x($|/))*$`) is rewritten into anchor-free branches.

An end anchor that is not the pattern's last item asserts that the match reaches the end of
the string there, so whatever follows it in the pattern must match the empty string. Every
parsed pattern splits exactly into two anchor-free parts: `free`, the matches that assert
no `$` (the string may go on after them), and `ended`, the matches that assert one (the
string ends with them). `pattern_regex` then generates `free` padded as usual and `ended`
with nothing after it. Other anchors inside a pattern (`^`, `\\b`) are left in place for
`_emit` to refuse.
"""

from __future__ import annotations

import re._constants as sre
import re._parser as sre_parse
from typing import Any

from gclm.compiler.front.json_schema.lengths import Items, width

_END = (sre.AT_END, sre.AT_END_STRING)
_START = (sre.AT_BEGINNING, sre.AT_BEGINNING_STRING)
Split = tuple[Items | None, Items | None]  # (free, ended); None: no match of that kind


def _alternatives(parsed: Items) -> list[Items]:
    """Split a top-level alternation so that each branch can carry its own anchors.

    Plain groups around the whole pattern or a whole branch are looked into
    (`^$|(^[a-z]+$)`), and a prefix Python's parser factored out of the branches (`^a|^b`
    parses as `^(?:a|b)`) is put back in front of each.
    """
    if len(parsed) == 1 and parsed[0][0] is sre.SUBPATTERN and not any(parsed[0][1][1:3]):
        return _alternatives(list(parsed[0][1][3]))
    if parsed and parsed[-1][0] is sre.BRANCH:
        prefix = parsed[:-1]
        return [alt for b in parsed[-1][1][1] for alt in _alternatives(prefix + list(b))]
    return [list(parsed)]


def _strip_anchors(items: Items) -> tuple[bool, Items, bool]:
    start = bool(items) and items[0][0] is sre.AT and items[0][1] in _START
    items = items[1:] if start else items
    end = bool(items) and items[-1][0] is sre.AT and items[-1][1] in _END
    return start, items[:-1] if end else items, end


def anchored_branches(parsed: Items) -> list[tuple[bool, Items, bool]]:
    """The pattern's alternatives as (anchored at the start, anchor-free body, at the end).

    An alternative with a `$` inside (see `split_end`) gives two: its matches that pass
    no `$`, and those that end the string.
    """
    out = []
    for items in _alternatives(parsed):
        start, body, end = _strip_anchors(items)
        if not has_anchor(body):
            out.append((start, body, end))
            continue
        free, ended = split_end(body)
        out += [(start, free, end)] if free is not None else []
        out += [(start, ended, True)] if ended is not None else []
    return out


def has_anchor(items: Items) -> bool:
    """Whether an anchor or word boundary occurs anywhere in `items`."""
    for op, av in items:
        if op is sre.AT:
            return True
        if op is sre.BRANCH and any(has_anchor(list(b)) for b in av[1]):
            return True
        if op is sre.SUBPATTERN and has_anchor(list(av[3])):
            return True
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT) and has_anchor(list(av[2])):
            return True
    return False


def split_end(items: Items) -> Split:
    """`items` as (free, ended): its matches without a `$`, and those ending the string."""
    free: Items | None = []
    ended: Items | None = None
    for item in items:
        n, t = _split_item(item)
        # A `$` already passed leaves only the empty string for this item to match.
        rest_empty = _nullable(n) or _nullable(t)
        ended = _alternation([_concat(free, t), ended if rest_empty else None])
        free = _concat(free, n)
    return free, ended


def _split_item(item: tuple[Any, Any]) -> Split:
    op, av = item
    if op is sre.AT and av in _END:
        return None, []
    if op is sre.BRANCH:
        parts = [split_end(list(b)) for b in av[1]]
        return _alternation([n for n, _ in parts]), _alternation([t for _, t in parts])
    if op is sre.SUBPATTERN:
        group, add_flags, del_flags, sub = av
        n, t = split_end(list(sub))
        return tuple(  # type: ignore[return-value]
            None if x is None else [(op, (group, add_flags, del_flags, _sub(x)))] for x in (n, t)
        )
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
        lo, hi, sub = av
        n, t = split_end(list(sub))
        free = _repeat(op, n, lo, hi)
        if t is None or hi == 0:
            return free, None
        # The iteration that passes `$` is the last one that consumes anything: the ones
        # before it are free; the ones after it, if lo asks for them, must match "".
        before_lo = 0 if _nullable(n) or _nullable(t) else max(lo - 1, 0)
        before_hi = hi if hi >= sre.MAXREPEAT else hi - 1
        return free, _concat(_repeat(op, n, before_lo, before_hi), t)
    return [item], None


def _sub(items: Items) -> sre_parse.SubPattern:
    return sre_parse.SubPattern(sre_parse.State(), list(items))


def _nullable(items: Items | None) -> bool:
    return items is not None and width(items)[0] == 0


def _concat(a: Items | None, b: Items | None) -> Items | None:
    return None if a is None or b is None else a + b


def _alternation(options: list[Items | None]) -> Items | None:
    kept = [x for x in options if x is not None]
    if len(kept) <= 1:
        return kept[0] if kept else None
    return [(sre.BRANCH, (None, [_sub(x) for x in kept]))]


def _repeat(op: Any, items: Items | None, lo: int, hi: int) -> Items | None:
    if items is None:
        return [] if lo == 0 else None
    if hi == 0:
        return []
    return [(op, (lo, hi, _sub(items)))]
