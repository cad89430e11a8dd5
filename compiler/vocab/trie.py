"""A vocabulary's tokens as a byte trie in preorder, the shape every token walk reads.

A walk visits the trie in preorder, so a prefix that many tokens share is walked once, and
the whole subtree under a byte a DFA state rejects is skipped at once (compiler/whole/
token_walk.py over a whole DFA, compiler/grown/state_walk.py state by state).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numba as nb
import numpy as np

from gclm.compiler.numba_cache import cache_per_version
from gclm.compiler.vocab.vocabulary import TokenVocabulary

cache_per_version(__file__)


@dataclass(frozen=True)
class TokenTrie:
    """A vocabulary's tokens as a trie in preorder (the root left out).

    Node k spells byte `byte[k]` at depth `depth[k]` (1 for a first byte); the nodes of its
    subtree follow it, and `skip[k]` is the first node after them. The ids of the tokens that
    end at node k are `token_ids[token_lo[k]:token_lo[k + 1]]`.
    """

    byte: np.ndarray  # int64 [N]
    depth: np.ndarray  # int64 [N]
    skip: np.ndarray  # int64 [N]
    token_lo: np.ndarray  # int64 [N + 1]
    token_ids: np.ndarray  # int64 [T]
    max_depth: int


_TRIES: weakref.WeakKeyDictionary[TokenVocabulary, TokenTrie] = weakref.WeakKeyDictionary()


def token_trie(vocab: TokenVocabulary) -> TokenTrie:
    """The trie of `vocab`'s tokens (EOS and tokens without bytes left out), built once per
    vocabulary object."""
    trie = _TRIES.get(vocab)
    if trie is None:
        kept = [
            i
            for i, data in enumerate(vocab.token_bytes)
            if data is not None and i != vocab.eos_token_id
        ]
        trie = _TRIES[vocab] = trie_of(vocab, kept)
    return trie


def trie_of(vocab: TokenVocabulary, ids: list[int]) -> TokenTrie:
    """The trie of the tokens `ids` of `vocab` (each with bytes)."""
    kept: list[tuple[bytes, int]] = []
    for i in ids:
        data = vocab.token_bytes[i]
        if data is None:
            raise ValueError(f"token {i} has no bytes to put in a trie")
        kept.append((data, i))
    kept.sort()
    token_ids = np.array([i for _, i in kept], dtype=np.int64)
    lengths = np.array([len(d) for d, _ in kept], dtype=np.int64)
    flat = np.frombuffer(b"".join(d for d, _ in kept), dtype=np.uint8)
    offsets = np.zeros(len(kept) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    byte, depth, skip, token_lo = _build_trie(flat, offsets)
    return TokenTrie(byte, depth, skip, token_lo, token_ids, int(lengths.max(initial=0)))


@nb.njit(cache=True)
def _build_trie(flat, offsets):
    """Preorder trie arrays (see TokenTrie) of byte strings sorted ascending."""
    n_tok = offsets.size - 1
    cap = flat.size + 1  # at most one node per byte
    byte = np.empty(cap, dtype=np.int64)
    depth = np.empty(cap, dtype=np.int64)
    skip = np.empty(cap, dtype=np.int64)
    end_node = np.empty(n_tok, dtype=np.int64)  # the node each token ends at
    open_nodes = np.empty(cap, dtype=np.int64)  # the current path, by depth - 1
    n = 0
    prev_lo, prev_len = 0, 0
    for t in range(n_tok):
        lo, length = offsets[t], offsets[t + 1] - offsets[t]
        common = 0  # bytes shared with the previous token: their nodes exist
        limit = min(length, prev_len)
        while common < limit and flat[lo + common] == flat[prev_lo + common]:
            common += 1
        for d in range(common, prev_len):  # the previous path's nodes below are closed
            skip[open_nodes[d]] = n
        for d in range(common, length):
            byte[n], depth[n] = flat[lo + d], d + 1
            open_nodes[d] = n
            n += 1
        end_node[t] = open_nodes[length - 1]
        prev_lo, prev_len = lo, length
    for d in range(prev_len):
        skip[open_nodes[d]] = n
    # Tokens are sorted, so the nodes they end at are non-decreasing: a CSR by node.
    token_lo = np.zeros(n + 1, dtype=np.int64)
    for t in range(n_tok):
        token_lo[end_node[t] + 1] += 1
    for k in range(n):
        token_lo[k + 1] += token_lo[k]
    return byte[:n].copy(), depth[:n].copy(), skip[:n].copy(), token_lo
