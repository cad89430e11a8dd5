"""Index a regex for a vocabulary: the vocabulary's byte trie walked through the byte DFA.

`outlines_core.Index(regex, vocabulary)` walks every token of the vocabulary, byte by byte,
from every DFA state it reaches, inserts each surviving (state, token) pair into a Rust
HashMap, and hands the result over as a bincode blob (bench/outlines_index.py decodes it, as the
reference the tests compare with).
Its cost is states x vocabulary: a JSON string bounded by `maxLength` has about eight DFA
states per character (the position, and the UTF-8 continuation bytes still owed there), so a
schema with two `maxLength: 255` strings has ~5,000 states and took 37 s of Index build plus
7 s of decoding on MaskBench's Github_medium---o12241 (bench/results/maskbench.md).

Here outlines-core builds the same DFA over a 256-token vocabulary, one token per byte
(cheap: 256 steps a state), and one compiled pass (numba) does the token walk itself: it
walks the vocabulary as a trie in preorder, so a prefix shared by many tokens is walked once
and the whole subtree under a byte the DFA rejects is skipped at once (in a state that owes
a UTF-8 continuation byte, all but a few hundred of the 49k tokens go in one step). It
groups each state's tokens by successor into packed rows exactly as the reference reader does, and
returns the same GroupedIndex: the same states, edges, accepting states and token sets, as
tests/compiler/whole/test_token_walk.py checks against outlines-core's own token Index.

Why the two walks agree: outlines-core keeps a token when no byte of it reaches the DFA's
dead (or quit) state and its last state is not a "match" state short of the end of input;
every regex gclm compiles ends in `$` (compiler/front/regex.py), so a match happens only at the
end of input, no state reached by a byte is a match state, and the byte Index has exactly
the byte transitions that do not die. Walking a token through them is walking it through
the DFA. Only states reached by some token are visited, from the start state, as
outlines-core's breadth-first search does.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numba as nb
import numpy as np

from gclm.compiler.numba_cache import cache_per_version
from gclm.compiler.service.progress import DONE as _DONE
from gclm.compiler.service.progress import new_slots
from gclm.compiler.vocab.trie import token_trie
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.byte_dfa import ByteDfa

cache_per_version(__file__)

# _walk's status codes: done, retry with more room for a state's groups, too many states.
_OK, _MORE_GROUPS, _TOO_MANY_STATES = 0, 2, 3


@dataclass(frozen=True)
class GroupedIndex:
    """A token index as successor groups over dense state ids (before pruning)."""

    initial: int
    accepting: np.ndarray  # bool [S]
    group_src: np.ndarray  # int64 [G], sorted
    group_next: np.ndarray  # int64 [G]
    group_set: np.ndarray  # int64 [G], row of packed_sets
    state_set: np.ndarray  # int64 [S], row of packed_sets (the forward set, EOS excluded)
    packed_sets: np.ndarray  # int32 [M, W], unique rows
    eos_token_id: int


def walk_tokens(
    dfa: ByteDfa,
    vocab: TokenVocabulary,
    *,
    max_states: int | None = None,
    group_cap: int = 256,
    progress: np.ndarray | None = None,
) -> GroupedIndex | None:
    """The GroupedIndex of `dfa` over `vocab`'s tokens (what read_index gives for
    outlines-core's token Index of the same regex), or None as soon as more than
    `max_states` states are reached. `group_cap` is the room for one state's successors
    to start with; the walk runs again with more when a state has more. The states walked
    so far are written to `progress[DONE]` (compiler/service/progress.py) as the walk goes."""
    if dfa.classes is not None:
        raise ValueError("walk_tokens walks a ByteDfa with a column per byte, not a compact one")
    slots = new_slots() if progress is None else progress
    trie = token_trie(vocab)
    words = (vocab.size + 31) // 32
    limit = -1 if max_states is None else max_states
    while True:
        status, accepting, gsrc, gnext, gmask, smask, pool = _walk(
            dfa.next,
            dfa.accepting,
            trie.byte,
            trie.depth,
            trie.skip,
            trie.token_lo,
            trie.token_ids,
            trie.max_depth,
            words,
            token_hashes(words * 32),
            limit,
            group_cap,
            slots,
        )
        if status != _MORE_GROUPS:
            break
        group_cap *= 4
    if status != _OK:
        return None
    return GroupedIndex(
        initial=0,
        accepting=accepting,
        group_src=gsrc,
        group_next=gnext,
        group_set=gmask,
        state_set=smask,
        packed_sets=pool.view(np.int32),
        eos_token_id=vocab.eos_token_id,
    )


@nb.njit(cache=True)
def _walk(
    trans,
    final,
    node_byte,
    node_depth,
    node_skip,
    token_lo,
    token_ids,
    max_depth,
    words,
    token_hash,
    max_states,
    group_cap,
    progress,
):
    """Breadth-first over the states tokens reach from state 0: per state, the trie in
    preorder through `trans`, its tokens bucketed by successor into packed rows that are
    interned (as bench/outlines_index.py's reader does). Dense ids in order of first sight. Gives up
    with _MORE_GROUPS when a state has more than `group_cap` successors."""
    n_dfa = trans.shape[0]
    n_nodes = node_byte.size
    dense = np.full(n_dfa, -1, dtype=np.int64)  # DFA state -> dense id
    order = np.empty(n_dfa, dtype=np.int64)  # dense id -> DFA state
    dense[0], order[0] = 0, 0
    n_states = 1
    path = np.empty(max_depth + 1, dtype=np.int64)
    stamp = np.full(n_dfa, -1, dtype=np.int64)
    slot_of = np.zeros(n_dfa, dtype=np.int64)
    # Never reallocated: numba keeps the per-token loop tight only while they stay put.
    rows = np.zeros((group_cap, words), dtype=np.uint32)
    row_hash = np.zeros(group_cap, dtype=np.uint64)
    gnext = np.zeros(group_cap, dtype=np.int64)
    fwd = np.zeros(words, dtype=np.uint32)
    pool = np.zeros((64, words), dtype=np.uint32)
    hashes = np.zeros(1 << 12, dtype=np.int64)
    table = np.full(1 << 13, -1, dtype=np.int64)
    n_pool = 0
    g_src = np.empty(1024, dtype=np.int64)
    g_next = np.empty_like(g_src)
    g_mask = np.empty_like(g_src)
    n_groups = 0
    state_set = np.empty(n_dfa, dtype=np.int64)
    empty = np.zeros(0, dtype=np.int64)
    no_states = np.zeros(0, dtype=np.bool_)
    head = 0
    while head < n_states:
        progress[_DONE] = head  # read by the compile pool for its Retry-After
        src = head
        head += 1
        path[0] = order[src]
        ng = 0
        k = 0
        while k < n_nodes:
            nxt = trans[path[node_depth[k] - 1], node_byte[k]]
            if nxt < 0:  # dead: so is every token under this node
                k = node_skip[k]
                continue
            path[node_depth[k]] = nxt
            lo, hi = token_lo[k], token_lo[k + 1]
            if lo < hi:
                if dense[nxt] == -1:
                    if n_states == max_states:
                        return (
                            _TOO_MANY_STATES,
                            no_states,
                            empty,
                            empty,
                            empty,
                            empty,
                            pool[:0].copy(),
                        )
                    dense[nxt] = n_states
                    order[n_states] = nxt
                    n_states += 1
                if stamp[nxt] != src:
                    if ng == group_cap:
                        none = pool[:0].copy()
                        return _MORE_GROUPS, no_states, empty, empty, empty, empty, none
                    stamp[nxt] = src
                    slot_of[nxt] = ng
                    rows[ng, :] = 0
                    row_hash[ng] = 0
                    gnext[ng] = dense[nxt]
                    ng += 1
                r = slot_of[nxt]
                for j in range(lo, hi):
                    tok = token_ids[j]
                    rows[r, tok >> 5] |= np.uint32(1 << (tok & 31))
                    row_hash[r] ^= token_hash[tok]
            k += 1
        g_src, g_next, g_mask, n_groups, pool, n_pool, table, hashes = intern_groups(
            src, rows, row_hash, gnext, ng, fwd, state_set,
            g_src, g_next, g_mask, n_groups, pool, n_pool, table, hashes,
        )  # fmt: skip
    accepting = np.zeros(n_states, dtype=np.bool_)
    for d in range(n_states):
        accepting[d] = final[order[d]]
    return (
        _OK,
        accepting,
        g_src[:n_groups].copy(),
        g_next[:n_groups].copy(),
        g_mask[:n_groups].copy(),
        state_set[:n_states].copy(),
        pool[:n_pool].copy(),
    )


@lru_cache(maxsize=4)
def token_hashes(n: int) -> np.ndarray:
    """A random 64-bit word per token id; a token set's hash is the XOR of its words."""
    return np.random.default_rng(0x6C6D).integers(0, 2**63, size=n, dtype=np.uint64)


@nb.njit(cache=True)
def intern_groups(
    src, rows, row_hash, gnext, ng, fwd, state_set,
    g_src, g_next, g_mask, n_groups, pool, n_pool, table, hashes,
):  # fmt: skip
    """State `src`'s `ng` successor groups (token rows `rows[:ng]` with their hashes, and
    the successors `gnext[:ng]`) appended to the groups so far, each row interned in
    `pool`, and the union of the rows (its forward set, built in `fwd`) interned as
    `state_set[src]`. Returns the group arrays, the pool and its probe table, each grown
    where it had no room, with their new counts."""
    if n_groups + ng > g_src.size:
        g_src = grown(g_src, n_groups + ng)
        g_next = grown(g_next, n_groups + ng)
        g_mask = grown(g_mask, n_groups + ng)
    if 2 * (n_pool + ng + 2) > table.size:
        table, hashes = rehash(n_pool, hashes, 4 * (n_pool + ng + 2))
    if n_pool + ng + 2 > pool.shape[0]:
        pool = grown_rows(pool, n_pool + ng + 2)
    fwd[:] = 0
    fwd_hash = np.uint64(0)
    for g in range(ng):
        fwd |= rows[g]
        fwd_hash ^= row_hash[g]
        mid, n_pool = intern(rows[g], row_hash[g], pool, n_pool, table, hashes)
        g_src[n_groups], g_next[n_groups], g_mask[n_groups] = src, gnext[g], mid
        n_groups += 1
    state_set[src], n_pool = intern(fwd, fwd_hash, pool, n_pool, table, hashes)
    return g_src, g_next, g_mask, n_groups, pool, n_pool, table, hashes


@nb.njit(cache=True)
def grown(arr, size):
    out = np.empty(max(2 * arr.size, size), dtype=arr.dtype)
    out[: arr.size] = arr
    return out


@nb.njit(cache=True)
def grown_rows(pool, rows):
    out = np.zeros((max(2 * pool.shape[0], rows), pool.shape[1]), dtype=pool.dtype)
    out[: pool.shape[0]] = pool
    return out


@nb.njit(cache=True)
def intern(row, h, pool, n_pool, table, hashes):
    """Index of `row` (with hash `h`) in pool[:n_pool], appending it if new. The caller
    keeps room in `pool` and keeps `table` under half full. Returns (index, n_pool)."""
    key = np.int64(h >> np.uint64(1))
    mask = table.size - 1
    i = (key ^ (key >> 29)) & mask
    while table[i] != -1:
        j = table[i]
        if hashes[j] == key:
            same = True
            for w in range(row.size):
                if pool[j, w] != row[w]:
                    same = False
                    break
            if same:
                return j, n_pool
        i = (i + 1) & mask
    pool[n_pool] = row
    hashes[n_pool] = key
    table[i] = n_pool
    return n_pool, n_pool + 1


@nb.njit(cache=True)
def rehash(n_pool, hashes, size):
    """A probe table of `size` slots (a power of two) over the first n_pool hashes."""
    cap = 1
    while cap < size:
        cap *= 2
    table = np.full(cap, -1, dtype=np.int64)
    grown = np.zeros(cap // 2, dtype=np.int64)
    grown[:n_pool] = hashes[:n_pool]
    mask = cap - 1
    for j in range(n_pool):
        i = (grown[j] ^ (grown[j] >> 29)) & mask
        while table[i] != -1:
            i = (i + 1) & mask
        table[i] = j
    return table, grown
