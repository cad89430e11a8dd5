"""Object regexes outlines-core cannot write: pattern-named keys, and keys past the declared.

- keyed: `additionalProperties: false` with `patternProperties` and nothing declared; every
  key's name matches one of the patterns.
- open: declared properties (in order, the required ones always) with any number of other
  keys before, between and after them, for an explicit `additionalProperties` (true or a
  schema) or none said under `--additional-properties spec`. An extra key is
  never a declared name: it is written with raw characters only (no escapes, so one text per
  name) and a trie of the declared names is left out of it, so no key can repeat a declared
  one (a validator reads the last of two equal keys; the declared schema would not hold).

- counted: declared properties under minProperties/maxProperties, as every allowed choice
  of the optional ones (each choice's entries in declared order).

All follow outlines-core's layout: `{`, entries joined by `,`, `}`, the same whitespace
between tokens. Value regexes are built by the caller (`regex.py`).
"""

from __future__ import annotations

import json
from typing import Any

from gclm.compiler.front.json_schema.patterns import escape_literal

_RAW = '"\\\\\\x00-\\x1F'  # inside [^...]: what a raw JSON string character is not


def keyed_object_regex(
    name_regexes: list[str], value: str, min_props: int, max_props: int | None, ws: str
) -> str:
    """An object of undeclared keys only, each named by one of `name_regexes` (quotes in)."""
    if max_props == 0:
        return rf"\{{{ws}\}}"
    entry = f"(?:{'|'.join(name_regexes)}){ws}:{ws}(?:{value})"
    most = "" if max_props is None else max_props - 1
    more = f"(?:{ws},{ws}{entry}){{{max(min_props - 1, 0)},{most}}}"
    body = entry + more if min_props else f"(?:{entry}{more})?"
    return rf"\{{{ws}{body}{ws}\}}"


def open_object_regex(
    entries: list[tuple[str, str, bool]],
    extra: str,
    ws: str,
    anywhere: bool = True,
    absent: list[str] | None = None,
) -> str:
    """Declared (name, value regex, required) entries in order, with other keys' entries
    before, between and after them (`anywhere`), or after them only. No other key is a
    declared name, nor one of `absent` (names the object may not hold).

    Written left to right so that each part appears once or twice, not once per way of
    starting the object: `upto` is every way to write what comes before entry k's place,
    something written (so entry k needs a comma); entry k is also the first thing written
    while no entry before it is required. A form with one alternative per first entry,
    each with its own copy of the rest, is quadratic in the entries, and its DFA keeps a
    copy of every later value per alternative.
    """
    names = [name for name, _, _ in entries] + list(absent or ())
    sep = f"{ws},{ws}"
    other = f"{other_key_regex(names)}{ws}:{ws}(?:{extra})"
    others = f"(?:{sep}{other})*"
    between = others if anywhere else ""
    upto: str | None = f"{other}{others}" if anywhere else None  # before entry 0
    may_start = True  # no entry so far is required: this one may be the first written
    for name, value, required in entries:
        key = escape_literal(json.dumps(name, ensure_ascii=False)[1:-1])
        entry = f'"{key}"{ws}:{ws}(?:{value})'
        if upto is None:
            written = entry
        else:
            after = f"{upto}{sep}{entry}" if required else f"{upto}(?:{sep}{entry})?"
            written = f"(?:{after}|{entry})" if may_start else after
        upto = written + between
        may_start = may_start and not required
    body = upto if anywhere else f"{upto}{others}"
    if may_start:  # nothing required: other keys alone, or nothing
        body = f"(?:{body})?" if anywhere else f"(?:{body}|{other}{others})?"
    return rf"\{{{ws}{body}{ws}\}}"


def counted_object_regex(entries: dict[str, str], choices: list[list[str]], ws: str) -> str:
    """Objects holding exactly one of `choices` (lists of names) of the (name: value) entries."""
    written = {
        n: f'"{escape_literal(json.dumps(n, ensure_ascii=False)[1:-1])}"{ws}:{ws}(?:{v})'
        for n, v in entries.items()
    }
    bodies = [f"{ws},{ws}".join(written[n] for n in choice) for choice in choices]
    alternatives = [rf"\{{{ws}{b}{ws}\}}" if b else rf"\{{{ws}\}}" for b in bodies]
    return "(?:" + "|".join(alternatives) + ")"


def other_key_regex(names: list[str]) -> str:
    """A JSON string of raw characters (no escapes) that is none of `names`, quotes in.

    Two walks of the names' trie: one that leaves it (a character no name has there, then
    any raw characters: one loop shared by every exit, so the automaton holds it once) and
    one that stops inside it where no name ends.
    """
    trie: dict[str, Any] = {}
    for name in names:
        if any(c in '"\\' or ord(c) < 0x20 for c in name):
            continue  # its text has an escape: no raw-only key can be equal to it
        node = trie
        for c in name:
            node = node.setdefault(c, {})
        node[""] = {}  # the name ends here
    stops = _stops(trie)
    ascii_names = all(c.isascii() for c in _chars(trie))
    # With ASCII names, a string with any other character is none of them: it leaves the
    # trie at that character, written once here rather than at every node.
    leaves = f"{_exits(trie, ascii_names)}[^{_RAW}]*"
    if ascii_names:
        leaves += f"|[^{_RAW}\\x80-\\U0010FFFF]*[^\\x00-\\x7F][^{_RAW}]*"
    return '"(?:' + leaves + ("" if stops is None else "|" + stops) + ')"'


def _chars(node: dict[str, Any]) -> set[str]:
    return {c for c in node if c}.union(*(_chars(v) for v in node.values()))


def _exits(node: dict[str, Any], ascii_only: bool) -> str:
    """The raw strings that leave the trie below `node`, up to their first character that
    no name has there (an ASCII one if `ascii_only`)."""
    children = [c for c in node if c]
    excluded = "".join(escape_literal(c) for c in children)
    top = "\\x80-\\U0010FFFF" if ascii_only else ""
    parts = [f"[^{_RAW}{top}{excluded}]"]
    parts += [escape_literal(c) + _exits(node[c], ascii_only) for c in children]
    return "(?:" + "|".join(parts) + ")"


def _stops(node: dict[str, Any]) -> str | None:
    """The strings that end inside the trie below `node` where no name ends; None: none."""
    parts = [] if "" in node else [""]
    for c in (c for c in node if c):
        below = _stops(node[c])
        if below is not None:
            parts.append(escape_literal(c) + below)
    return None if not parts else "(?:" + "|".join(parts) + ")"
