"""A tighter upper bound on a state's token distance: one shortest path, spelled in tokens.

A LazyTable's upper bound (compiler/grown/lazy_table.py) counts the bytes of the shortest path to
acceptance along bytes that are tokens by themselves: that path spelled one byte a token.
The same bytes spelled with the fewest tokens of the vocabulary (longer tokens where they
match) still spell a path to acceptance, so their count is an upper bound too, and on
long paths several times smaller: a schema whose shortest instance is 3,000 bytes has a
byte bound of 3,000 but writes that instance in about 1,000 tokens. Where the budget binds
on the byte bound (a max_tokens between the two), this one decides without the exact
search over the token graph, which walks every state it meets.

The path is read out of the byte DFA (each step a byte to a state one nearer) or, for a
grown DFA, out of its NFA (compiler/grown/regex_nfa.py), through the member of the state's set
that is nearest; the fewest tokens spelling it are one pass of dynamic programming over
the vocabulary's trie.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from gclm.compiler.numba_cache import cache_per_version
from gclm.compiler.vocab.trie import TokenTrie

cache_per_version(__file__)


def fewest_tokens(spelled: np.ndarray, trie: TokenTrie) -> int:
    """The fewest tokens of `trie` that spell the bytes `spelled` (uint8) exactly; every
    byte of it must be a token by itself."""
    return int(_fewest_tokens(spelled, trie.byte, trie.skip, trie.token_lo))


@nb.njit(cache=True, nogil=True)
def _fewest_tokens(spelled, node_byte, node_skip, token_lo):
    """best[i]: the fewest tokens spelling spelled[i:], from the end back; a token that
    starts at i is a trie node on the path of spelled[i:] where tokens end."""
    length = spelled.size
    root = np.full(256, -1, dtype=np.int64)  # the root's child for each first byte
    j = 0
    while j < node_byte.size:  # the root's children are chained by their skips
        root[node_byte[j]] = j
        j = node_skip[j]
    best = np.full(length + 1, length + 1, dtype=np.int64)
    best[length] = 0
    for i in range(length - 1, -1, -1):
        node = root[spelled[i]]
        at = i + 1
        while node >= 0:
            if token_lo[node + 1] > token_lo[node] and best[at] + 1 < best[i]:
                best[i] = best[at] + 1
            if at == length:
                break
            child = -1
            c = node + 1
            while c < node_skip[node]:
                if node_byte[c] == spelled[at]:
                    child = c
                    break
                c = node_skip[c]
            node = child
            at += 1
    return best[0]


@nb.njit(cache=True, nogil=True)
def dfa_path(trans, columns, single, spelled_bytes, state):
    """A shortest path from `state` to acceptance along bytes in `spelled_bytes` (bool
    [256]), uint8 [single[state]]: `single` is the byte DFA's distance along those bytes
    (a byte's column of `trans` is `columns[byte]`); empty only if `single` is not
    that distance."""
    left = single[state]
    out = np.empty(left, dtype=np.uint8)
    s = state
    for i in range(left):
        n = -1
        for b in range(256):
            if spelled_bytes[b]:
                n = trans[s, columns[b]]
                if n >= 0 and single[n] == left - 1 - i:
                    out[i] = b
                    break
                n = -1
        if n < 0:  # no such byte: `single` is not this DFA's (the caller sees it empty)
            return out[:0]
        s = n
    return out


@nb.njit(cache=True, nogil=True)
def nfa_path(
    start, accept, eps_at, eps_to, byte_at, byte_lo, byte_hi, byte_to, single, spelled_bytes,
    stamp, visit,
):  # fmt: skip
    """A shortest path from NFA state `start` to `accept` along bytes in `spelled_bytes`,
    uint8 [single[start]] (empty only if `single` is not the NFA's distances). At each
    distance the epsilon edges that keep it are searched (marked in `stamp` with a fresh
    `visit`, for their cycles) for a byte edge one nearer."""
    left = single[start]
    out = np.empty(left, dtype=np.uint8)
    stack = np.empty(64, dtype=np.int64)
    q = start
    for i in range(left + 1):
        d = left - i
        visit[0] += 1
        mark = visit[0]
        stamp[q] = mark
        stack[0] = q
        size = 1
        found = -1
        while size and found < 0:
            size -= 1
            p = stack[size]
            if d == 0:
                if p == accept:
                    found = p
                    break
            else:
                for j in range(byte_at[p], byte_at[p + 1]):
                    if single[byte_to[j]] == d - 1:
                        for b in range(byte_lo[j], byte_hi[j] + 1):
                            if spelled_bytes[b]:
                                out[i] = b
                                found = byte_to[j]
                                break
                        if found >= 0:
                            break
                if found >= 0:
                    break
            for j in range(eps_at[p], eps_at[p + 1]):  # the same distance, further on
                t = eps_to[j]
                if stamp[t] != mark and single[t] == d:
                    stamp[t] = mark
                    if size == stack.size:
                        stack = np.concatenate((stack, np.empty(stack.size, dtype=np.int64)))
                    stack[size] = t
                    size += 1
        if found < 0:  # `single` is not this NFA's (the caller sees it empty)
            return out[:0]
        q = found
    return out
