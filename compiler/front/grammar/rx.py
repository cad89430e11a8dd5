"""Regex text built from parts, with what a caller needs to combine it: whether it matches
the empty string, and whether it must be grouped before a quantifier or a concatenation.

`None` stands for the language with no string (a recursion cut off, an alternation with no
branch left); the constructors fold it away as a language would.
"""

from __future__ import annotations

from dataclasses import dataclass


class RegexTooLong(Exception):
    """A part of the regex grew past the limit it was built under."""


@dataclass(frozen=True)
class Rx:
    text: str
    nullable: bool
    # Holds a top-level `|`: group it before concatenating.
    alternation: bool = False
    # One character, class or group: a quantifier may follow it as is.
    atomic: bool = False


EMPTY = Rx("", True, atomic=False)


def raw(text: str, nullable: bool) -> Rx:
    """A regex written elsewhere (a literal, a translated pattern), grouped unless it is
    one plain character."""
    if len(text) == 1 and text not in "\\.+*?()|[]{}^$#&-~":
        return Rx(text, nullable, atomic=True)
    return Rx(f"(?:{text})", nullable, atomic=True)


class Builder:
    """Combines Rx parts, refusing any longer than `limit` characters."""

    def __init__(self, limit: int):
        self.limit = limit

    def _check(self, text: str) -> str:
        if len(text) > self.limit:
            raise RegexTooLong
        return text

    def seq(self, parts: list[Rx | None]) -> Rx | None:
        if any(p is None for p in parts):
            return None
        kept = [p for p in parts if p is not None and p.text]
        if not kept:
            return EMPTY
        if len(kept) == 1:
            return kept[0]
        text = "".join(f"(?:{p.text})" if p.alternation else p.text for p in kept)
        return Rx(self._check(text), all(p.nullable for p in kept))

    def alt(self, options: list[Rx | None]) -> Rx | None:
        kept: list[Rx] = []
        for o in options:
            if o is not None and o not in kept:
                kept.append(o)
        if not kept:
            return None
        if len(kept) == 1:
            return kept[0]
        nullable = any(o.nullable for o in kept)
        texts = [o.text for o in kept if o.text]
        if len(texts) == 1:
            return self.repeat(Rx(texts[0], False, kept[0].alternation, kept[0].atomic), 0, 1)
        text = self._check("|".join(texts))
        if nullable:
            return Rx(self._check(f"(?:{text})?"), True, atomic=False)
        return Rx(text, False, alternation=True)

    def repeat(self, part: Rx | None, low: int, high: int | None) -> Rx | None:
        if part is None:
            return EMPTY if low == 0 else None
        if not part.text or high == 0:
            return EMPTY
        if (low, high) == (1, 1):
            return part
        body = part.text if part.atomic else f"(?:{part.text})"
        op = {(0, 1): "?", (0, None): "*", (1, None): "+"}.get((low, high))
        if op is None:
            op = (
                f"{{{low},}}"
                if high is None
                else f"{{{low}}}"
                if low == high
                else f"{{{low},{high}}}"
            )
        return Rx(self._check(body + op), part.nullable or low == 0)
