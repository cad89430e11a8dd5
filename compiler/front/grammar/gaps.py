"""What may stand between two tokens of a rule: the `%ignore` terminals, as Lark's lexer
skips them.

Lark matches an ignored terminal greedily and does not try shorter matches: after `%ignore
CPP_COMMENT`, the text `//x;` is one comment, never a comment `//x` and a token `;`. So an
ignored piece is generated only where no character after it could extend it: not before a
token or another piece whose first byte would (`WS` is never followed by a second `WS`:
one takes the whole run; a comment to the end of the line only before a newline). A gap
holds at most MAX_PIECES pieces: with two, a grammar that ignores both `WS` and
`C_COMMENT` holds four copies of the comment's Unicode classes in every gap, and
outlines-core takes 15 s to build its automaton (0.1 s with one).
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from gclm.compiler.front.grammar.rx import EMPTY, Builder, Rx
from gclm.compiler.whole.byte_dfa import byte_dfa

MAX_PIECES = 1


@functools.cache
def _dfa_bytes(regex: str) -> tuple[frozenset[int], frozenset[int]]:
    """(first bytes, bytes that extend a complete match) of `regex`'s strings."""
    dfa = byte_dfa(f"(?:{regex})$")
    first = frozenset(np.flatnonzero(dfa.next[0] >= 0).tolist())
    rows = dfa.next[dfa.accepting]  # [A, 256]
    extend = (
        frozenset(np.flatnonzero((rows >= 0).any(axis=0)).tolist()) if len(rows) else frozenset()
    )
    return first, extend


def first_bytes(regex: str) -> frozenset[int]:
    return _dfa_bytes(regex)[0]


class Gaps:
    """The gap regexes of a grammar's %ignore pieces."""

    def __init__(self, pieces: list[Rx], build: Builder):
        self.pieces = pieces
        self.build = build
        self.extend = [_dfa_bytes(p.text)[1] for p in pieces]
        first = [_dfa_bytes(p.text)[0] for p in pieces]
        k = range(len(pieces))
        self.sequences = [
            seq
            for n in range(1, MAX_PIECES + 1)
            for seq in itertools.product(k, repeat=n)
            if all(not self.extend[a] & first[b] for a, b in itertools.pairwise(seq))
        ]
        self._memo: dict[frozenset[int], Rx] = {}

    def before(self, token: Rx) -> Rx:
        """The gap before `token`: pieces the token's first byte cannot extend last."""
        if not self.pieces:
            return EMPTY
        first = first_bytes(token.text) if any(self.extend) else frozenset()
        return self._gap(frozenset(i for i, e in enumerate(self.extend) if not e & first))

    def trailing(self) -> Rx:
        """The gap at the end of the text (nothing follows it)."""
        return self._gap(frozenset(range(len(self.pieces)))) if self.pieces else EMPTY

    def _gap(self, last: frozenset[int]) -> Rx:
        if last not in self._memo:
            options = [
                self.build.seq([self.pieces[i] for i in seq])
                for seq in self.sequences
                if seq[-1] in last
            ]
            self._memo[last] = self.build.repeat(self.build.alt(list(options)), 0, 1) or EMPTY
        return self._memo[last]
