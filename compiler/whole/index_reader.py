"""Read an outlines-core `Index` straight into grouped, packed tables.

`Index.get_transitions()` materialises a dict of dicts (20-35% of the Index build on large
schemas, and more than the build on string-heavy ones). `Index.__reduce__()` instead hands
back the Rust struct serialised with bincode, which one compiled pass (numba) walks, grouping
each state's tokens by successor into packed bitmasks as it goes.

Layout for outlines-core 0.2.14 (bincode, standard config: little-endian, variable-length
integers), guarded by tests/compiler/whole/test_index_reader.py against get_transitions():

    initial_state: u32
    final_states:  len, u32 * len                                     (HashSet)
    transitions:   len, (state: u32, len, (token: u32, next: u32) * len) * len  (HashMap)
    eos_token_id:  u32
    vocab_size:    u64

A varint below 251 is one byte; 251, 252 and 253 announce a u16, u32 or u64 that follows.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numba as nb
import numpy as np
import outlines_core

from gclm.compiler.numba_cache import cache_per_version

OUTLINES_CORE_VERSION = "0.2.14"

cache_per_version(__file__)


@dataclass(frozen=True)
class GroupedIndex:
    """An Index as successor groups over dense state ids (before pruning)."""

    initial: int
    accepting: np.ndarray  # bool [S]
    group_src: np.ndarray  # int64 [G], sorted
    group_next: np.ndarray  # int64 [G]
    group_set: np.ndarray  # int64 [G], row of packed_sets
    state_set: np.ndarray  # int64 [S], row of packed_sets (the forward set, EOS excluded)
    packed_sets: np.ndarray  # int32 [M, W], unique rows
    eos_token_id: int


def read_index(index: outlines_core.Index, vocab_size: int, eos_token_id: int) -> GroupedIndex:
    """Decode `index` (built over token ids < vocab_size) into successor groups."""
    _, (blob,) = index.__reduce__()
    return parse_index_bytes(blob, vocab_size, eos_token_id)


def read_byte_index(index: outlines_core.Index, eos_token_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Decode `index`, built over one token per byte (id = the byte), into a dense table:
    (int32 [S, 256], -1 where a byte dies; bool [S], accepting), ids in order of first
    sight as read_index gives them (the initial state 0).

    No grouping: a byte DFA's table is what its callers want, and at 256 tokens the groups
    and their packed rows cost more than the table (read_index took longer than the Index
    build on string-heavy schemas).
    """
    _, (blob,) = index.__reduce__()
    buf = np.frombuffer(blob, dtype=np.uint8)
    max_id, _, end, eos = _extent(buf)
    _check_layout(buf, end, eos, eos_token_id)
    table, accepting = _byte_table(buf, max_id, eos_token_id)
    return table, accepting.astype(bool)


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
        max_id, max_degree, _, _ = _extent(buf)
        id_cap = max_id + 1 if id_cap is None else id_cap
        group_cap = max(max_degree, 1) if group_cap is None else group_cap
    words = (vocab_size + 31) // 32
    hashes = _token_hashes(words * 32)
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
    _check_layout(buf, end, eos, eos_token_id)
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


def _check_layout(buf: np.ndarray, end: int, eos: int, eos_token_id: int) -> None:
    """Raise unless the blob was read to its end and holds the EOS id it was built with."""
    if end != buf.size or eos != eos_token_id:
        raise ValueError(
            f"Index layout not understood (EOS {eos}, {buf.size - end} trailing bytes): this "
            f"reader supports outlines-core {OUTLINES_CORE_VERSION} only."
        )


@lru_cache(maxsize=4)
def _token_hashes(n: int) -> np.ndarray:
    """A random 64-bit word per token id; a token set's hash is the XOR of its words."""
    return np.random.default_rng(0x6C6D).integers(0, 2**63, size=n, dtype=np.uint64)


@nb.njit(cache=True, inline="always")
def _varint(buf, pos):
    b = buf[pos]
    if b < 251:
        return np.int64(b), pos + 1
    if b == 251:
        return np.int64(buf[pos + 1]) | (np.int64(buf[pos + 2]) << 8), pos + 3
    if b == 252:
        v = np.int64(buf[pos + 1]) | (np.int64(buf[pos + 2]) << 8)
        v |= (np.int64(buf[pos + 3]) << 16) | (np.int64(buf[pos + 4]) << 24)
        return v, pos + 5
    v = np.int64(0)
    for i in range(8):
        v |= np.int64(buf[pos + 1 + i]) << (8 * i)
    return v, pos + 9


@nb.njit(cache=True)
def _extent(buf):
    """(largest state id, largest number of edges of a state, end position, EOS id) of a
    serialised Index, read without keeping anything."""
    pos = 0
    max_id, pos = _varint(buf, pos)
    n_final, pos = _varint(buf, pos)
    for _ in range(n_final):
        sid, pos = _varint(buf, pos)
        max_id = max(max_id, sid)
    n_rec, pos = _varint(buf, pos)
    max_degree = np.int64(0)
    for _ in range(n_rec):
        sid, pos = _varint(buf, pos)
        max_id = max(max_id, sid)
        deg, pos = _varint(buf, pos)
        max_degree = max(max_degree, deg)
        for _ in range(deg):
            _, pos = _varint(buf, pos)
            nxt, pos = _varint(buf, pos)
            max_id = max(max_id, nxt)
    eos, pos = _varint(buf, pos)
    _, pos = _varint(buf, pos)  # vocab_size
    return max_id, max_degree, pos, eos


@nb.njit(cache=True)
def _byte_table(buf, max_id, eos):
    """read_byte_index's pass: dense ids in order of first sight (as _group gives them),
    then the table filled in a second read of the records."""
    dense = np.full(max_id + 1, -1, dtype=np.int64)
    pos = 0
    initial, pos = _varint(buf, pos)
    dense[initial] = 0
    n = 1
    n_final, pos = _varint(buf, pos)
    finals = np.empty(n_final, dtype=np.int64)
    for i in range(n_final):
        sid, pos = _varint(buf, pos)
        if dense[sid] == -1:
            dense[sid] = n
            n += 1
        finals[i] = dense[sid]
    n_rec, pos = _varint(buf, pos)
    records = pos
    for _ in range(n_rec):
        sid, pos = _varint(buf, pos)
        if dense[sid] == -1:
            dense[sid] = n
            n += 1
        deg, pos = _varint(buf, pos)
        for _ in range(deg):
            _, pos = _varint(buf, pos)
            nxt, pos = _varint(buf, pos)
            if dense[nxt] == -1:
                dense[nxt] = n
                n += 1
    table = np.full((n, 256), -1, dtype=np.int32)
    pos = records
    for _ in range(n_rec):
        sid, pos = _varint(buf, pos)
        src = dense[sid]
        deg, pos = _varint(buf, pos)
        for _ in range(deg):
            tok, pos = _varint(buf, pos)
            nxt, pos = _varint(buf, pos)
            if tok != eos and tok < 256:
                table[src, tok] = dense[nxt]
    accepting = np.zeros(n, dtype=np.uint8)
    accepting[finals] = 1
    return table, accepting


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
        tok, pos = _varint(buf, pos)
        nxt, pos = _varint(buf, pos)
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
    initial, pos = _varint(buf, pos)
    n_final, pos = _varint(buf, pos)
    if initial >= id_cap:
        return _retry(_MORE_IDS, words)
    dense[initial] = 0
    n_states = 1
    final_ids = np.empty(n_final, dtype=np.int64)
    for i in range(n_final):
        sid, pos = _varint(buf, pos)
        if sid >= id_cap:
            return _retry(_MORE_IDS, words)
        if dense[sid] == -1:
            dense[sid] = n_states
            n_states += 1
        final_ids[i] = dense[sid]
    n_rec, pos = _varint(buf, pos)

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
        sid, pos = _varint(buf, pos)
        if sid >= id_cap:
            return _retry(_MORE_IDS, words)
        if dense[sid] == -1:
            dense[sid] = n_states
            n_states += 1
        src = dense[sid]
        deg, pos = _varint(buf, pos)
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
    trailer_eos, pos = _varint(buf, pos)
    _, pos = _varint(buf, pos)  # outlines' vocab_size: unused, ours is the tokenizer's

    # States without a record of their own (dead ends) get the empty mask.
    fwd[:] = 0
    if n_pool + 1 > pool.shape[0]:
        pool = _grown_rows(pool, n_pool + 1)
    if 2 * (n_pool + 2) > table.size:
        table, hashes = _rehash(n_pool, hashes, 4 * (n_pool + 2))
    empty_id, n_pool = _intern(fwd, np.uint64(0), pool, n_pool, table, hashes)
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


@nb.njit(cache=True)
def _grown(arr, size):
    out = np.empty(max(2 * arr.size, size), dtype=arr.dtype)
    out[: arr.size] = arr
    return out


@nb.njit(cache=True)
def _grown_rows(pool, rows):
    out = np.zeros((max(2 * pool.shape[0], rows), pool.shape[1]), dtype=pool.dtype)
    out[: pool.shape[0]] = pool
    return out


@nb.njit(cache=True)
def _intern(row, h, pool, n_pool, table, hashes):
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
def _rehash(n_pool, hashes, size):
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
