"""The tokens that are plain JSON string text, set apart so that a walk need not visit them.

Inside a JSON string most of a vocabulary is text: a 200k vocabulary has 194,033 tokens made
of whole characters that a string holds raw (any character but `"`, `\\` and U+0000..U+001F),
and 5,965 others (a quote, a backslash, a control character, or part of a character). In a
DFA state that every such character leads back to itself, each of the 194,033 leads back to
it too (a token is a string of characters), so a walk from that state (compiler/grown/lazy_table.py)
need only walk the others, a trie of 11,630 nodes instead of 421,660, and add the text
tokens as one packed row whose successor is the state itself.

The state just after a string's opening quote is often not that state but leads every
character to it: there the text tokens all go to that state, and the walk is as short.

`text_slice(vocab)` gives the text tokens' row and the others' trie, once per vocabulary.
`text_target` says where the text tokens lead from a state, if to one state: it walks every
character of the class through the DFA from the state (the UTF-8 byte automaton below times
the DFA states it meets), asks that each one end in the same state t, and that every
character lead t back to t. Nothing is assumed about the regex: a string with a pattern, a
length, or outlines-core's narrower class simply fails the check, and the state is walked
whole.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numba as nb
import numpy as np

from gclm.compiler.grown.state_walk import NO_LEVELS
from gclm.compiler.numba_cache import cache_per_version
from gclm.compiler.vocab.trie import TokenTrie, trie_of
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.token_sets import words_for

cache_per_version(__file__)

_DONE = -2  # a character is complete
# One raw JSON string character in UTF-8 (RFC 3629; no surrogates): by automaton state, each
# byte's next state, -1 where the byte cannot come. 0 is the start; 1, 2, 3: that many
# continuation bytes (80-BF) still owed; 4: after E0 (A0-BF next); 5: after ED (80-9F);
# 6: after F0 (90-BF); 7: after F4 (80-8F).
_CHAR = np.full((8, 256), -1, dtype=np.int64)
_CHAR[0, 0x20:0x80] = _DONE
_CHAR[0, ord('"')] = _CHAR[0, ord("\\")] = -1
_CHAR[0, 0xC2:0xE0] = 1
_CHAR[0, 0xE0] = 4
_CHAR[0, 0xE1:0xF0] = 2
_CHAR[0, 0xED] = 5
_CHAR[0, 0xF0] = 6
_CHAR[0, 0xF1:0xF4] = 3
_CHAR[0, 0xF4] = 7
_CHAR[1, 0x80:0xC0] = _DONE
_CHAR[2, 0x80:0xC0] = 1
_CHAR[3, 0x80:0xC0] = 2
_CHAR[4, 0xA0:0xC0] = 1
_CHAR[5, 0x80:0xA0] = 1
_CHAR[6, 0x90:0xC0] = 2
_CHAR[7, 0x80:0x90] = 2
_MAX_PAIRS = 64  # (automaton state, DFA state) pairs a check may meet before it gives up
_NO_FLOOR = np.zeros(1, dtype=np.int64)


def is_text(data: bytes) -> bool:
    """Whether `data` is whole characters a JSON string holds raw."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(c not in '"\\' and c >= " " for c in text)


@dataclass(frozen=True)
class TextSlice:
    """A vocabulary split for walks from text states: the text tokens as a packed row, and
    every other token (EOS and tokens without bytes left out, as in `token_trie`) as a trie."""

    row: np.ndarray  # uint32 [W]: the text tokens
    count: int  # how many they are
    rest: TokenTrie


_SLICES: weakref.WeakKeyDictionary[TokenVocabulary, TextSlice] = weakref.WeakKeyDictionary()


def text_slice(vocab: TokenVocabulary) -> TextSlice:
    """`vocab`'s TextSlice, built once per vocabulary object."""
    found = _SLICES.get(vocab)
    if found is None:
        text: list[int] = []
        rest: list[int] = []
        for i, data in enumerate(vocab.token_bytes):
            if data is not None and i != vocab.eos_token_id:
                (text if is_text(data) else rest).append(i)
        row = np.zeros(words_for(vocab.size), dtype=np.uint32)
        ids = np.array(text, dtype=np.int64)
        np.bitwise_or.at(row, ids >> 5, (np.uint32(1) << (ids & 31)).astype(np.uint32))
        row.flags.writeable = False
        found = TextSlice(row, len(text), trie_of(vocab, rest))
        _SLICES[vocab] = found
    return found


def text_target(  # noqa: ANN001
    trans, columns, built, state, levels=NO_LEVELS, floor=_NO_FLOOR
) -> tuple[int, int]:
    """Where every text token leads from `state` through `trans` (a byte's column:
    `columns[byte]`), if they all lead to one state: (0, t) when every raw JSON string
    character leads `state` to t and t back to itself; (2, -1) when not, or when the check
    met too many states; (1, s) when it needs row `s`, which `built` says is not there yet:
    build it and ask again. `levels` and `floor`: as compiler/grown/state_walk.py's
    walk_trie reads them."""
    status, target = _one_target(trans, columns, built, state, _CHAR, levels, floor)
    if status != 0 or target == state:
        return status, target
    status, again = _one_target(trans, columns, built, target, _CHAR, levels, floor)
    if status != 0 or again == target:
        return status, target if status == 0 else again
    return 2, -1


@nb.njit(cache=True, nogil=True)
def _one_target(trans, columns, built, state, char, levels, floor):
    """(0, t) when every character of `char` leads `state` to t; else as text_target."""
    at_x = np.empty(_MAX_PAIRS, dtype=np.int64)  # the pairs met, in the order met
    at_s = np.empty(_MAX_PAIRS, dtype=np.int64)
    n = 1
    at_x[0], at_s[0] = 0, state
    read = 0
    target = -1
    while read < n:
        x, s = at_x[read], at_s[read]
        read += 1
        if not built[s]:
            return 1, s
        if levels.size > 0 and levels[s] < floor[0]:
            floor[0] = levels[s]
        for b in range(256):
            y = char[x, b]
            if y == -1:
                continue
            t = trans[s, columns[b]]
            if t < 0:
                return 2, -1
            if y == _DONE:
                if target == -1:
                    target = t
                elif t != target:
                    return 2, -1
                continue
            seen = False
            for i in range(n):
                if at_x[i] == y and at_s[i] == t:
                    seen = True
                    break
            if not seen:
                if n == _MAX_PAIRS:
                    return 2, -1
                at_x[n], at_s[n] = y, t
                n += 1
    return 0, target
