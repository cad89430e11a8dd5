"""The compiled half of one DFA state's walk (compiler/grown/lazy_table.py): the vocabulary's trie
walked from the state, its tokens grouped by the state each one ends in, and the groups
stored small.

`walk_trie` visits the trie in preorder and stops where the DFA has no row yet (a grown DFA
builds it, then the walk goes on from the same node). It writes each token twice: a bit in
its group's packed row, and a (token, group) pair. The pairs say where every bit is, so
that `split_groups` reads a group that holds few tokens out of its pairs instead of
scanning its row (25 KB at 200k tokens), and `clear_rows` leaves the scratch rows zero by
clearing only the words the pairs name. Scratch arrays are per thread: walks of one table
run under its lock, walks of different tables on different threads.
"""

from __future__ import annotations

import threading

import numba as nb
import numpy as np

from gclm.compiler.numba_cache import cache_per_version

cache_per_version(__file__)

_local = threading.local()
# `walk_trie`'s `levels` for a DFA whose rows read no stack (all but compiler/grown/pushdown.py's).
NO_LEVELS = np.zeros(0, dtype=np.int32)


def scratch_rows(width: int, groups: int, used: np.ndarray | None = None) -> np.ndarray:
    """This thread's zeroed uint32 [>= groups, width] rows (a 200k vocabulary's 64 are
    1.6 MB: made once per thread, not per walk or per table). `used`: the rows so far, kept
    in the larger array that replaces them."""
    rows = getattr(_local, "rows", None)
    if rows is None or rows.shape[1] != width or rows.shape[0] < groups:
        rows = np.zeros((max(groups, 64), width), dtype=np.uint32)
        if used is not None:
            rows[: used.shape[0]] = used
        _local.rows = rows
    return rows


def scratch_pairs(tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """This thread's int32 [>= tokens] (token, group) pair arrays."""
    pairs = getattr(_local, "pairs", None)
    if pairs is None or pairs[0].size < tokens:
        pairs = _local.pairs = (np.empty(tokens, np.int32), np.empty(tokens, np.int32))
    return pairs


def clear_scratch() -> None:
    """Zero this thread's rows whole (after a walk stopped midway, its pairs unknown)."""
    rows = getattr(_local, "rows", None)
    if rows is not None:
        rows[:] = 0


@nb.njit(cache=True, nogil=True)
def walk_trie(
    trans, columns, built, node_byte, node_depth, node_skip, token_lo, token_ids, k, path, ng,
    nexts, rows, counts, stamp, slot_of, walk_id, pair_tok, pair_slot, n_pairs, levels, floor,
):  # fmt: skip
    """The trie in preorder through `trans` (a byte's column: `columns[byte]`) from the
    state `path[0]`, from trie node `k` with the states of `path` so far: each token's bit
    set in the row of the group of the DFA state it ends in (as token_walk._walk does for
    one state), counted in `counts`, and written as a (token, group) pair.

    Returns (status, k, groups, pairs): status 0 when done; 1 when the walk needs row
    `path[node_depth[k] - 1]`, which `built` says is not there yet; 2 when `nexts` is full.
    Then call again with the same k, groups and pairs, once the row is built or `nexts`,
    `counts` and `rows` are larger.

    `levels` (by state; empty: none) is how far down its stack each state's row read
    (compiler/grown/pushdown.py): `floor[0]` is lowered to the least among the rows read."""
    n_nodes = node_byte.size
    while k < n_nodes:
        s = path[node_depth[k] - 1]
        if not built[s]:
            return 1, k, ng, n_pairs
        if levels.size > 0 and levels[s] < floor[0]:
            floor[0] = levels[s]
        nxt = trans[s, columns[node_byte[k]]]
        if nxt < 0:  # dead: so is every token under this node
            k = node_skip[k]
            continue
        path[node_depth[k]] = nxt
        lo, hi = token_lo[k], token_lo[k + 1]
        if lo < hi:
            if stamp[nxt] != walk_id:
                if ng == nexts.size:
                    return 2, k, ng, n_pairs
                stamp[nxt] = walk_id
                slot_of[nxt] = ng
                nexts[ng] = nxt
                ng += 1
            r = slot_of[nxt]
            counts[r] += hi - lo
            for j in range(lo, hi):
                tok = token_ids[j]
                rows[r, tok >> 5] |= np.uint32(1 << (tok & 31))
                pair_tok[n_pairs] = tok
                pair_slot[n_pairs] = r
                n_pairs += 1
        k += 1
    return 0, k, ng, n_pairs


@nb.njit(cache=True, nogil=True)
def split_groups(rows, counts, keep, pair_tok, pair_slot, n_pairs):
    """The walk's groups `keep` says to keep, stored small: a group of at least W tokens
    (W: words in a row) stays a packed row, a smaller one becomes its token ids.

    Returns (forward, dense, ids, group, span, by_group): forward, uint32 [W], the union of
    the kept groups; dense, bool [G], the groups kept as rows; ids, int32 [n], every kept
    sparse group's tokens, sorted, and group, int32 [n], the index among the kept groups of
    the group each is in; group g's ids, sorted, are `by_group[span[g]:span[g + 1]]`."""
    width = rows.shape[1]
    ng = keep.size
    dense = np.zeros(ng, dtype=np.bool_)
    place = np.zeros(ng, dtype=np.int32)  # each group's index among the kept ones
    kept = 0
    for g in range(ng):
        if keep[g]:
            place[g] = kept
            kept += 1
            dense[g] = counts[g] >= width
    forward = np.zeros(width, dtype=np.uint32)
    for g in range(ng):
        if dense[g]:
            forward |= rows[g]
    n = 0
    for p in range(n_pairs):
        g = pair_slot[p]
        if keep[g] and not dense[g]:
            n += 1
    ids = np.empty(n, dtype=np.int32)
    group = np.empty(n, dtype=np.int32)
    span = np.zeros(ng + 1, dtype=np.int64)
    n = 0
    for p in range(n_pairs):
        g = pair_slot[p]
        if keep[g] and not dense[g]:
            tok = pair_tok[p]
            forward[tok >> 5] |= np.uint32(1 << (tok & 31))
            ids[n] = tok
            group[n] = g
            span[g + 1] += 1
            n += 1
    order = np.argsort(ids)  # tokens are distinct
    ids, group = ids[order], group[order]
    for g in range(ng):
        span[g + 1] += span[g]
    by_group = np.empty(n, dtype=np.int32)
    at = span[:-1].copy()
    for i in range(n):  # in token order, so each group's ids come out sorted
        g = group[i]
        by_group[at[g]] = ids[i]
        at[g] += 1
        group[i] = place[g]
    return forward, dense, ids, group, span, by_group


@nb.njit(cache=True, nogil=True)
def clear_rows(rows, pair_tok, pair_slot, n_pairs, whole):
    """Zero the words the pairs set, and row `whole` entirely (-1: none): a walk's rows are
    zero again."""
    for p in range(n_pairs):
        rows[pair_slot[p], pair_tok[p] >> 5] = 0
    if whole >= 0:
        rows[whole] = 0


@nb.njit(cache=True, nogil=True)
def digest(row):
    """A 64-bit hash of a packed row's words (a dictionary key; rows are compared too)."""
    h = np.uint64(0x9E3779B97F4A7C15)
    for w in range(row.size):
        h = (h ^ np.uint64(row[w])) * np.uint64(0x100000001B3)
        h ^= h >> np.uint64(29)
    return np.int64(h)
