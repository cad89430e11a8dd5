"""outlines-core's own token Index read into a GroupedIndex: the reference the token walk is
checked against (tests/compiler/whole/test_token_walk.py), and the path bench/compile.py
measures beside it.

`outlines_core.Index(regex, vocabulary)` walks every token from every DFA state; its
`__reduce__()` hands back the Rust struct serialised with bincode (the layout is in
compiler/whole/byte_dfa.py), which one compiled pass (numba) walks here, grouping each
state's tokens by successor into packed bitmasks as it goes (`Index.get_transitions()`
would materialise a dict of dicts first).
"""

from __future__ import annotations

import numba as nb
import numpy as np
import outlines_core

from gclm.compiler import CompiledTable, TokenVocabulary
from gclm.compiler.whole.byte_dfa import check_layout, index_extent, varint
from gclm.compiler.whole.compile import table_from_grouped
from gclm.compiler.whole.tables import with_shortest_output
from gclm.compiler.whole.token_walk import (
    GroupedIndex,
    grown_rows,
    intern,
    intern_groups,
    rehash,
    token_hashes,
)


def read_index(index: outlines_core.Index, vocab_size: int, eos_token_id: int) -> GroupedIndex:
    """Decode `index` (built over token ids < vocab_size) into successor groups."""
    _, (blob,) = index.__reduce__()
    return parse_index_bytes(blob, vocab_size, eos_token_id)


def table_from_index(
    index: outlines_core.Index, vocab: TokenVocabulary, *, max_states: int | None = None
) -> CompiledTable:
    """The CompiledTable of an outlines-core Index built over `vocab`, shortest output spelled."""
    grouped = read_index(index, vocab.size, vocab.eos_token_id)
    table = table_from_grouped(grouped, vocab, max_states=max_states)
    return with_shortest_output(table, vocab.token_bytes)


def parse_index_bytes(
    blob: bytes,
    vocab_size: int,
    eos_token_id: int,
    *,
    id_cap: int | None = None,
    group_cap: int | None = None,
) -> GroupedIndex:
    """Decode a serialised Index. One compiled pass buckets each state's tokens by
    successor into packed rows and interns the rows; no per-edge array is built. The caps
    (room for state ids, and for one state's successors) come from a first pass that only
    reads the numbers; the grouping pass runs again with more room when one passed in is
    exceeded.
    """
    buf = np.frombuffer(blob, dtype=np.uint8)
    if id_cap is None or group_cap is None:
        # outlines-core's state ids are sparse (a multiple of the DFA's stride): guessing
        # the room and retrying allocated and filled arrays of millions (0.1-0.5 s).
        max_id, max_degree, _, _ = index_extent(buf)
        id_cap = max_id + 1 if id_cap is None else id_cap
        group_cap = max(max_degree, 1) if group_cap is None else group_cap
    words = (vocab_size + 31) // 32
    hashes = token_hashes(words * 32)
    while True:
        status, accepting, gsrc, gnext, gmask, smask, pool, meta, _ = _group(
            buf, words, hashes, eos_token_id, id_cap, group_cap
        )
        if status == _MORE_IDS:
            id_cap *= 8
        elif status == _MORE_GROUPS:
            group_cap *= 4
        else:
            break
    eos, end = int(meta[0]), int(meta[1])
    check_layout(buf, end, eos, eos_token_id)
    order = np.argsort(gsrc, kind="stable")
    return GroupedIndex(
        initial=0,  # the first state seen
        accepting=accepting.astype(bool),
        group_src=gsrc[order],
        group_next=gnext[order],
        group_set=gmask[order],
        state_set=smask,
        packed_sets=pool.view(np.int32),
        eos_token_id=eos,
    )


# _group's status codes: done, or retry with more room for state ids or per-state groups.
_OK, _MORE_IDS, _MORE_GROUPS = 0, 1, 2


@nb.njit(cache=True)
def _record(
    buf,
    pos,
    deg,
    k,
    eos,
    n_bits,
    token_hash,
    dense,
    n_states,
    stamp,
    slot_of,
    rows,
    row_hash,
    gnext,
):
    """Bucket one state's edges by successor into packed rows.

    Returns (status, pos, groups, n_states). No array is reallocated here: this is the
    per-edge loop, and numba keeps it tight only while they stay put.
    """
    ng = 0
    for _ in range(deg):
        tok, pos = varint(buf, pos)
        nxt, pos = varint(buf, pos)
        if tok == eos or tok >= n_bits:
            continue
        if nxt >= dense.size:
            return _MORE_IDS, pos, ng, n_states
        d = dense[nxt]
        if d == -1:
            d = n_states
            dense[nxt] = d
            n_states += 1
        if stamp[d] != k:
            if ng == rows.shape[0]:
                return _MORE_GROUPS, pos, ng, n_states
            stamp[d] = k
            slot_of[d] = ng
            rows[ng, :] = 0
            row_hash[ng] = 0
            gnext[ng] = d
            ng += 1
        r = slot_of[d]
        rows[r, tok >> 5] |= np.uint32(1 << (tok & 31))
        # XOR of per-token random words: the hash of a token set, built for free.
        row_hash[r] ^= token_hash[tok]
    return _OK, pos, ng, n_states


@nb.njit(cache=True)
def _group(buf, words, token_hash, eos, id_cap, group_cap):
    """One pass over the blob; see parse_index_bytes. Dense ids are given in order of
    first sight, the initial state first. A state seen only as a successor that is not
    final has no way out; the distance pass prunes it."""
    dense = np.full(id_cap, -1, dtype=np.int64)  # sparse id -> dense id
    pos = 0
    initial, pos = varint(buf, pos)
    n_final, pos = varint(buf, pos)
    if initial >= id_cap:
        return _retry(_MORE_IDS, words)
    dense[initial] = 0
    n_states = 1
    final_ids = np.empty(n_final, dtype=np.int64)
    for i in range(n_final):
        sid, pos = varint(buf, pos)
        if sid >= id_cap:
            return _retry(_MORE_IDS, words)
        if dense[sid] == -1:
            dense[sid] = n_states
            n_states += 1
        final_ids[i] = dense[sid]
    n_rec, pos = varint(buf, pos)

    stamp = np.full(id_cap, -1, dtype=np.int64)
    slot_of = np.zeros(id_cap, dtype=np.int64)
    rows = np.zeros((group_cap, words), dtype=np.uint32)
    row_hash = np.zeros(group_cap, dtype=np.uint64)
    gnext = np.zeros(group_cap, dtype=np.int64)
    fwd = np.zeros(words, dtype=np.uint32)
    pool = np.zeros((64, words), dtype=np.uint32)
    hashes = np.zeros(1 << 12, dtype=np.int64)
    table = np.full(1 << 13, -1, dtype=np.int64)
    n_pool = 0
    g_src = np.empty(n_rec * 4 + 16, dtype=np.int64)
    g_next = np.empty_like(g_src)
    g_mask = np.empty_like(g_src)
    n_groups = 0
    state_set = np.full(id_cap, -1, dtype=np.int64)
    for k in range(n_rec):
        sid, pos = varint(buf, pos)
        if sid >= id_cap:
            return _retry(_MORE_IDS, words)
        if dense[sid] == -1:
            dense[sid] = n_states
            n_states += 1
        src = dense[sid]
        deg, pos = varint(buf, pos)
        status, pos, ng, n_states = _record(
            buf,
            pos,
            deg,
            k,
            eos,
            words * 32,
            token_hash,
            dense,
            n_states,
            stamp,
            slot_of,
            rows,
            row_hash,
            gnext,
        )
        if status != _OK:
            return _retry(status, words)
        g_src, g_next, g_mask, n_groups, pool, n_pool, table, hashes = intern_groups(
            src, rows, row_hash, gnext, ng, fwd, state_set,
            g_src, g_next, g_mask, n_groups, pool, n_pool, table, hashes,
        )  # fmt: skip
    trailer_eos, pos = varint(buf, pos)
    _, pos = varint(buf, pos)  # outlines' vocab_size: unused, ours is the tokenizer's

    # States without a record of their own (dead ends) get the empty mask.
    fwd[:] = 0
    if n_pool + 1 > pool.shape[0]:
        pool = grown_rows(pool, n_pool + 1)
    if 2 * (n_pool + 2) > table.size:
        table, hashes = rehash(n_pool, hashes, 4 * (n_pool + 2))
    empty_id, n_pool = intern(fwd, np.uint64(0), pool, n_pool, table, hashes)
    smask = state_set[:n_states].copy()
    for i in range(n_states):
        if smask[i] == -1:
            smask[i] = empty_id
    accepting = np.zeros(n_states, dtype=np.bool_)
    accepting[final_ids] = True
    meta = np.array([trailer_eos, pos], dtype=np.int64)
    return (
        _OK,
        accepting.astype(np.int64),
        g_src[:n_groups].copy(),
        g_next[:n_groups].copy(),
        g_mask[:n_groups].copy(),
        smask,
        pool[:n_pool].copy(),
        meta,
        n_states,
    )


@nb.njit(cache=True)
def _retry(status, words):
    """_group's result when it must run again with more room."""
    empty = np.zeros(0, dtype=np.int64)
    return status, empty, empty, empty, empty, empty, np.zeros((0, words), np.uint32), empty, 0
