"""bench/lazy_reach.py's counts, on a hand-made vocabulary with exact expected states."""

from __future__ import annotations

import numpy as np

from bench.lazy_reach import _boundary_states, _touch
from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex
from gclm.compiler.vocab.trie import token_trie
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.byte_dfa import byte_dfa

TOKENS = (*(bytes([b]) for b in range(256)), b'{"a": ', b"}", None)
VOCAB = TokenVocabulary(TOKENS, eos_token_id=258, scheme="plain")
DFA = byte_dfa(to_regex(Constraint.regex(r'\{"a": [0-9]{1,3}\}')).regex)


def _state_after(text: bytes) -> int:
    state = 0
    for byte in text:
        state = int(DFA.next[state, DFA.columns[byte]])
    return state


def test_touch_marks_every_prefix_of_every_token_once():
    trie = token_trie(VOCAB)
    seen = np.zeros(DFA.next.shape[0], dtype=np.bool_)
    args = (DFA.next, DFA.columns, 0, trie.byte, trie.depth, trie.skip, trie.max_depth, seen)
    # The start, then '{', '{"', '{"a', '{"a"', '{"a":', '{"a": ' along the long token.
    assert _touch(*args) == 7
    expected = {_state_after(b'{"a": '[:n]) for n in range(7)}
    assert set(np.flatnonzero(seen).tolist()) == expected
    assert _touch(*args) == 0  # all seen already


def test_boundary_states_are_the_states_before_each_token():
    tokens = [b'{"a": ', b"4", b"2", b"}"]
    assert _boundary_states(DFA, tokens) == [
        0,
        _state_after(b'{"a": '),
        _state_after(b'{"a": 4'),
        _state_after(b'{"a": 42'),
    ]
    assert _boundary_states(DFA, [b'{"a": ', b"x"]) is None  # refused by a byte
    assert _boundary_states(DFA, [b'{"a": ', b"4"]) is None  # not accepted at the end
