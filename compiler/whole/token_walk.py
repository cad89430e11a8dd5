"""Index a regex for a vocabulary: the vocabulary's byte trie walked through the byte DFA.

`outlines_core.Index(regex, vocabulary)` walks every token of the vocabulary, byte by byte,
from every DFA state it reaches, inserts each surviving (state, token) pair into a Rust
HashMap, and hands the result over as a bincode blob that compiler/whole/index_reader.py decodes.
Its cost is states x vocabulary: a JSON string bounded by `maxLength` has about eight DFA
states per character (the position, and the UTF-8 continuation bytes still owed there), so a
schema with two `maxLength: 255` strings has ~5,000 states and took 37 s of Index build plus
7 s of decoding on MaskBench's Github_medium---o12241 (bench/results/maskbench.md).

Here outlines-core builds the same DFA over a 256-token vocabulary, one token per byte
(cheap: 256 steps a state), and one compiled pass (numba) does the token walk itself: it
walks the vocabulary as a trie in preorder, so a prefix shared by many tokens is walked once
and the whole subtree under a byte the DFA rejects is skipped at once (in a state that owes
a UTF-8 continuation byte, all but a few hundred of the 49k tokens go in one step). It
groups each state's tokens by successor into packed rows exactly as index_reader does, and
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

import io
import weakref
from dataclasses import dataclass

import numba as nb
import numpy as np
import outlines_core

from gclm.compiler.numba_cache import cache_per_version
from gclm.compiler.service.progress import DONE as _DONE
from gclm.compiler.service.progress import new_slots
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.index_reader import (
    _MORE_GROUPS,
    _OK,
    GroupedIndex,
    _grown,
    _grown_rows,
    _intern,
    _rehash,
    _token_hashes,
    read_byte_index,
)

cache_per_version(__file__)

BYTE_EOS = 256  # the byte vocabulary's EOS id: past every byte
# Every regex's DFA is built behind this byte and started after it. outlines-core builds
# its DFA with an unanchored start too (a match may begin at any byte), and where a
# regex's first characters recur inside it (a digit, then up to 19 more; a `{` inside a
# string) that part tracks every place a match could have begun: exponential in the count
# (the DFA itself stays small). A leading byte that starts nothing else leaves nothing to
# track. Measured: `json_object`'s DFA 5.4 s -> 0.06 s; a number between -1e20 and 1.1e20
# from over 5 minutes to 0.003 s.
SENTINEL_BYTE = 0x01
SENTINEL_REGEX = "\\x01"
_TOO_MANY_STATES = 3


def byte_vocabulary() -> outlines_core.Vocabulary:
    """One token per byte (id = the byte), EOS 256."""
    global _BYTE_VOCABULARY
    if _BYTE_VOCABULARY is None:
        _BYTE_VOCABULARY = outlines_core.Vocabulary(BYTE_EOS, {bytes([b]): [b] for b in range(256)})
    return _BYTE_VOCABULARY


_BYTE_VOCABULARY: outlines_core.Vocabulary | None = None


@dataclass(frozen=True)
class ByteDfa:
    """The DFA of a regex over bytes, dense ids from 0 (the start state).

    `next` has a column per byte, or, `compact`, one per class of bytes that every state
    sends to the same state: `classes[b]` is byte b's column."""

    next: np.ndarray  # int32 [S, 256] or [S, K], -1 where a byte leads to the dead state
    accepting: np.ndarray  # bool [S]
    classes: np.ndarray | None = None  # uint8 [256]: each byte's column (None: its own)

    @property
    def columns(self) -> np.ndarray:
        """uint8 [256]: each byte's column of `next`."""
        return _IDENTITY if self.classes is None else self.classes

    def compact(self) -> ByteDfa:
        """The same DFA with one column per class of bytes (57-77 classes in hard MaskBench
        schemas' DFAs: a quarter of the bytes to send and keep)."""
        if self.classes is not None:
            return self
        classes, kept = _column_classes(self.next)
        classes.flags.writeable = False
        return ByteDfa(np.ascontiguousarray(self.next[:, kept]), self.accepting, classes)

    def to_bytes(self) -> bytes:
        """The DFA as an .npz file's bytes (`from_bytes` reads them back)."""
        out = io.BytesIO()
        np.savez(out, next=self.next, accepting=self.accepting, classes=self.columns)
        return out.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> ByteDfa:
        """The DFA `to_bytes` wrote; raises ValueError (or KeyError, OSError) when damaged."""
        with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            next_, accepting, classes = arrays["next"], arrays["accepting"], arrays["classes"]
        if next_.ndim != 2 or accepting.shape != (next_.shape[0],) or classes.shape != (256,):
            raise ValueError("a stored byte DFA of the wrong shape")
        if int(classes.max()) >= next_.shape[1]:
            raise ValueError("a stored byte DFA whose classes point past its columns")
        classes.flags.writeable = False
        return cls(next_, accepting, None if next_.shape[1] == 256 else classes)


_IDENTITY = np.arange(256, dtype=np.uint8)
_IDENTITY.flags.writeable = False
# A random weight per state (by id mod 4096): a column's hash, before columns are compared.
_STATE_WEIGHTS = np.random.default_rng(0).integers(1, 2**63, size=4096, dtype=np.uint64)


def _column_classes(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 [256]: each column's class, int64 [K]: the first column of each class), where
    columns of `table` [S, 256] are in one class when they are equal in every row."""
    first: dict[int, int] = {}
    rep = np.array(
        [first.setdefault(h, b) for b, h in enumerate(_column_hashes(table, _STATE_WEIGHTS))],
        dtype=np.int64,
    )
    if not _columns_equal(table, rep):  # a hash collision: compare column by column
        rep = np.arange(256, dtype=np.int64)
        for b in range(256):
            rep[b] = next(a for a in range(b + 1) if np.array_equal(table[:, a], table[:, b]))
    kept = np.unique(rep)
    classes = np.searchsorted(kept, rep).astype(np.uint8)
    return classes, kept


@nb.njit(cache=True, nogil=True)
def _column_hashes(table, weights):
    """uint64 [columns]: each column's hash, read row by row."""
    states, columns = table.shape
    out = np.zeros(columns, dtype=np.uint64)
    for s in range(states):
        w = weights[s % weights.size]
        for c in range(columns):
            out[c] += np.uint64(table[s, c] + 2) * w
    return out


@nb.njit(cache=True, nogil=True)
def _columns_equal(table, rep):
    """Whether every column c of `table` equals column rep[c], in every row."""
    for s in range(table.shape[0]):
        for c in range(table.shape[1]):
            if table[s, c] != table[s, rep[c]]:
                return False
    return True


def byte_dfa(regex: str) -> ByteDfa:
    """The regex's byte DFA, read from an outlines-core Index over byte_vocabulary() of the
    regex behind SENTINEL_REGEX, and started after the sentinel.

    Raises what outlines_core.Index raises (ValueError and friends: compile.index_error
    turns them into gclm errors).
    """
    index = outlines_core.Index(SENTINEL_REGEX + regex, byte_vocabulary())
    table, accepting = read_byte_index(index, BYTE_EOS)
    # The state after the sentinel becomes state 0 (ids 0 and `start` swap); the state
    # before it is left where no token leads.
    start = int(table[0, SENTINEL_BYTE])
    swap = np.arange(table.shape[0], dtype=np.int32)
    swap[0], swap[start] = start, 0
    table = table[swap]
    live = table >= 0
    table[live] = swap[table[live]]
    return ByteDfa(next=table, accepting=accepting[swap])


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
            _token_hashes(words * 32),
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
    interned (as index_reader._group does). Dense ids in order of first sight. Gives up
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
        if n_groups + ng > g_src.size:
            g_src = _grown(g_src, n_groups + ng)
            g_next = _grown(g_next, n_groups + ng)
            g_mask = _grown(g_mask, n_groups + ng)
        if 2 * (n_pool + ng + 2) > table.size:
            table, hashes = _rehash(n_pool, hashes, 4 * (n_pool + ng + 2))
        if n_pool + ng + 2 > pool.shape[0]:
            pool = _grown_rows(pool, n_pool + ng + 2)
        fwd[:] = 0
        fwd_hash = np.uint64(0)
        for g in range(ng):
            fwd |= rows[g]
            fwd_hash ^= row_hash[g]
            mid, n_pool = _intern(rows[g], row_hash[g], pool, n_pool, table, hashes)
            g_src[n_groups], g_next[n_groups], g_mask[n_groups] = src, gnext[g], mid
            n_groups += 1
        state_set[src], n_pool = _intern(fwd, fwd_hash, pool, n_pool, table, hashes)
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
