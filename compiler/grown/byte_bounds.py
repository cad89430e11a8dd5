"""Bounds on a byte DFA state's token distance to acceptance, from byte distances alone.

A path of `b` bytes to acceptance along bytes that are each a token by themselves is spelled
in `b` tokens, so the fewest such bytes bound the token distance from above; any token
spells at most the longest token's bytes, so the fewest bytes at all, divided by that
length, bound it from below. compiler/grown/lazy_table.py uses both to decide most budgets
without exact token distances.
"""

from __future__ import annotations

import weakref

import numba as nb
import numpy as np

from gclm.compiler.numba_cache import cache_per_version
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.byte_dfa import ByteDfa
from gclm.compiler.whole.tables import UNREACHABLE

cache_per_version(__file__)

_SINGLE: weakref.WeakKeyDictionary[TokenVocabulary, np.ndarray] = weakref.WeakKeyDictionary()


def single_byte_tokens(vocab: TokenVocabulary) -> np.ndarray:
    """bool [256]: the bytes that are a token by themselves (EOS and special tokens aside),
    found once per vocabulary object (read-only)."""
    out = _SINGLE.get(vocab)
    if out is None:
        out = np.zeros(256, dtype=bool)
        for i, data in enumerate(vocab.token_bytes):
            if data is not None and len(data) == 1 and i != vocab.eos_token_id:
                out[data[0]] = True
        out.flags.writeable = False
        _SINGLE[vocab] = out
    return out


def byte_bounds(dfa: ByteDfa, spelled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(fewest bytes to acceptance, fewest bytes along bytes in `spelled` [256]) per state,
    int32 [S] each, UNREACHABLE where there is no such path."""
    columns = dfa.next.shape[1]
    # A column (a class of bytes, for a compact DFA) is spelled if one of its bytes is.
    by_column = np.zeros(columns, dtype=np.bool_)
    np.logical_or.at(by_column, dfa.columns, np.asarray(spelled, dtype=np.bool_))
    every = _byte_distances(dfa.next, dfa.accepting, np.ones(columns, dtype=np.bool_))
    single = _byte_distances(dfa.next, dfa.accepting, by_column)
    return every, single


@nb.njit(cache=True, nogil=True)
def _byte_distances(trans, accepting, spelled):
    """Reverse BFS over the byte DFA's edges whose column is in `spelled`."""
    states, columns = trans.shape
    offsets = np.zeros(states + 1, dtype=np.int64)
    for s in range(states):
        for b in range(columns):
            n = trans[s, b]
            if n >= 0 and spelled[b]:
                offsets[n + 1] += 1
    for s in range(states):
        offsets[s + 1] += offsets[s]
    preds = np.empty(offsets[states], dtype=np.int64)
    fill = offsets[:-1].copy()
    for s in range(states):
        for b in range(columns):
            n = trans[s, b]
            if n >= 0 and spelled[b]:
                preds[fill[n]] = s
                fill[n] += 1
    dist = np.full(states, UNREACHABLE, dtype=np.int32)
    queue = np.empty(states, dtype=np.int64)
    tail = 0
    for s in range(states):
        if accepting[s]:
            dist[s] = 0
            queue[tail] = s
            tail += 1
    head = 0
    while head < tail:
        n = queue[head]
        head += 1
        for j in range(offsets[n], offsets[n + 1]):
            p = preds[j]
            if dist[p] == UNREACHABLE:
                dist[p] = dist[n] + 1
                queue[tail] = p
                tail += 1
    return dist
