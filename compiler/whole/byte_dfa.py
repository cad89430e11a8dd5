"""A regex's byte DFA, built by outlines-core over one token per byte and read into arrays.

outlines-core builds the regex's DFA over a 256-token vocabulary (one token per byte, EOS
256): cheap, 256 steps a state. `Index.__reduce__()` hands the result back as the Rust struct
serialised with bincode, which one compiled pass (numba) reads into a dense table
(`read_byte_index`), and `byte_dfa` makes the ByteDfa the later stages walk: the token walk
(compiler/whole/token_walk.py) and the grown path's LazyTable over outlines-core's DFA
(compiler/grown/lazy_table.py).

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

import io
from dataclasses import dataclass

import numba as nb
import numpy as np
import outlines_core

from gclm.compiler.numba_cache import cache_per_version

OUTLINES_CORE_VERSION = "0.2.14"

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
    max_id, _, end, eos = index_extent(buf)
    check_layout(buf, end, eos, eos_token_id)
    table, accepting = _byte_table(buf, max_id, eos_token_id)
    return table, accepting.astype(bool)


def check_layout(buf: np.ndarray, end: int, eos: int, eos_token_id: int) -> None:
    """Raise unless the blob was read to its end and holds the EOS id it was built with."""
    if end != buf.size or eos != eos_token_id:
        raise ValueError(
            f"Index layout not understood (EOS {eos}, {buf.size - end} trailing bytes): this "
            f"reader supports outlines-core {OUTLINES_CORE_VERSION} only."
        )


@nb.njit(cache=True, inline="always")
def varint(buf, pos):
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
def index_extent(buf):
    """(largest state id, largest number of edges of a state, end position, EOS id) of a
    serialised Index, read without keeping anything."""
    pos = 0
    max_id, pos = varint(buf, pos)
    n_final, pos = varint(buf, pos)
    for _ in range(n_final):
        sid, pos = varint(buf, pos)
        max_id = max(max_id, sid)
    n_rec, pos = varint(buf, pos)
    max_degree = np.int64(0)
    for _ in range(n_rec):
        sid, pos = varint(buf, pos)
        max_id = max(max_id, sid)
        deg, pos = varint(buf, pos)
        max_degree = max(max_degree, deg)
        for _ in range(deg):
            _, pos = varint(buf, pos)
            nxt, pos = varint(buf, pos)
            max_id = max(max_id, nxt)
    eos, pos = varint(buf, pos)
    _, pos = varint(buf, pos)  # vocab_size
    return max_id, max_degree, pos, eos


@nb.njit(cache=True)
def _byte_table(buf, max_id, eos):
    """read_byte_index's pass: dense ids in order of first sight (as _group gives them),
    then the table filled in a second read of the records."""
    dense = np.full(max_id + 1, -1, dtype=np.int64)
    pos = 0
    initial, pos = varint(buf, pos)
    dense[initial] = 0
    n = 1
    n_final, pos = varint(buf, pos)
    finals = np.empty(n_final, dtype=np.int64)
    for i in range(n_final):
        sid, pos = varint(buf, pos)
        if dense[sid] == -1:
            dense[sid] = n
            n += 1
        finals[i] = dense[sid]
    n_rec, pos = varint(buf, pos)
    records = pos
    for _ in range(n_rec):
        sid, pos = varint(buf, pos)
        if dense[sid] == -1:
            dense[sid] = n
            n += 1
        deg, pos = varint(buf, pos)
        for _ in range(deg):
            _, pos = varint(buf, pos)
            nxt, pos = varint(buf, pos)
            if dense[nxt] == -1:
                dense[nxt] = n
                n += 1
    table = np.full((n, 256), -1, dtype=np.int32)
    pos = records
    for _ in range(n_rec):
        sid, pos = varint(buf, pos)
        src = dense[sid]
        deg, pos = varint(buf, pos)
        for _ in range(deg):
            tok, pos = varint(buf, pos)
            nxt, pos = varint(buf, pos)
            if tok != eos and tok < 256:
                table[src, tok] = dense[nxt]
    accepting = np.zeros(n, dtype=np.uint8)
    accepting[finals] = 1
    return table, accepting
