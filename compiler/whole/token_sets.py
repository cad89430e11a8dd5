"""A compiled table's distinct token sets, each stored in whichever of three forms is smallest.

Most masks of a JSON constraint are tiny (the one or two tokens that spell the next key) or
nearly the whole vocabulary (the tokens allowed inside a string). A packed bitmask row costs
`V / 8` bytes whatever it holds, so a ten-state table with a dozen distinct masks per state
would take 5% of the dense `S x V` int64 tensor the GCLM seed stores. Here a set of `k`
tokens out of `V` is kept as

- the list of its tokens (4k bytes) when `k < W`, the int32 words of a packed row;
- the list of the tokens it lacks (4(V - k) bytes) when `V - k < W`;
- a packed row (4W bytes) otherwise,

so no set costs more than a packed row, and a one-token set costs 4 bytes. `packed(rows)`
turns any rows back into the packed form the sampler applies to logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

# Names of the arrays, as stored in a table's .npz (prefixed with "set_").
ARRAYS = ("offsets", "tokens", "complement", "dense_row", "dense")


def words_for(vocab_size: int) -> int:
    """int32 words in one packed row for a vocabulary of `vocab_size` tokens."""
    return (vocab_size + 31) // 32


@lru_cache(maxsize=8)
def full_row(vocab_size: int) -> np.ndarray:
    """uint32 [W] with the bit of every token id below `vocab_size` set (read-only)."""
    bits = np.zeros(words_for(vocab_size) * 32, dtype=np.uint8)
    bits[:vocab_size] = 1
    row = np.packbits(bits, bitorder="little").view(np.uint32)
    row.flags.writeable = False
    return row


def unpack_row(row: np.ndarray) -> np.ndarray:
    """Token ids set in one packed int32 row."""
    bits = np.unpackbits(row.view(np.uint8), bitorder="little")
    return np.flatnonzero(bits).astype(np.int32)


def spans(offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For a CSR `offsets`, the positions in `offsets[r]:offsets[r+1]` of every `r` in `rows`,
    concatenated in order, and the index into `rows` each position came from."""
    starts, counts = offsets[rows], offsets[rows + 1] - offsets[rows]
    which = np.repeat(np.arange(rows.size), counts)
    idx = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
    return idx, which


@dataclass(frozen=True, eq=False)
class TokenSets:
    """`M` distinct token sets over token ids `0..vocab_size-1`.

    Set `i` is stored one of three ways:

    - listed: `tokens[offsets[i]:offsets[i+1]]` (sorted) are its tokens;
    - listed with `complement[i]`: those tokens are the ones it lacks;
    - packed: `dense[dense_row[i]]` when `dense_row[i] >= 0` (its listed span is empty).
    """

    vocab_size: int
    offsets: np.ndarray  # int64 [M+1]
    tokens: np.ndarray  # int32 [N]
    complement: np.ndarray  # bool [M]
    dense_row: np.ndarray  # int32 [M], -1 for a listed set
    dense: np.ndarray  # int32 [D, W]

    @classmethod
    def from_packed(cls, packed: np.ndarray, vocab_size: int) -> TokenSets:
        """Store packed int32 rows [M, W] (no bits at or past `vocab_size`) compactly."""
        width = words_for(vocab_size)
        packed = np.ascontiguousarray(packed, dtype=np.int32).reshape(-1, width)
        m = packed.shape[0]
        counts = np.bitwise_count(packed.view(np.uint32)).sum(axis=1, dtype=np.int64)  # [M]
        plain = counts < width
        complement = ~plain & (vocab_size - counts < width)
        listed = plain | complement
        sub = packed[listed].view(np.uint32)  # [L, W], a copy
        sub[complement[listed]] ^= full_row(vocab_size)
        # Row-major, so tokens come out sorted within each row. (np.nonzero on the words
        # themselves is ten times slower than on a boolean array.)
        flat = np.flatnonzero(sub.ravel() != 0)
        row, word = np.divmod(flat, width)
        bits = (sub.ravel()[flat][:, None] >> np.arange(32, dtype=np.uint32)) & 1  # [Z, 32]
        hit, bit = np.nonzero(bits)
        tokens = (word[hit].astype(np.int64) * 32 + bit).astype(np.int32)
        per_row = np.zeros(m, dtype=np.int64)
        per_row[listed] = np.bincount(row[hit], minlength=int(listed.sum()))
        offsets = np.zeros(m + 1, dtype=np.int64)
        np.cumsum(per_row, out=offsets[1:])
        dense_row = np.full(m, -1, dtype=np.int32)
        dense_row[~listed] = np.arange(m - int(listed.sum()), dtype=np.int32)
        return cls(
            vocab_size=vocab_size,
            offsets=offsets,
            tokens=tokens,
            complement=complement,
            dense_row=dense_row,
            dense=np.ascontiguousarray(packed[~listed]),
        )

    @classmethod
    def from_token_sets(cls, sets: list[list[int]], vocab_size: int) -> TokenSets:
        """A pool of the given token sets, in order (for tests and hand-made tables)."""
        packed = np.zeros((len(sets), words_for(vocab_size)), dtype=np.uint32)
        for i, tokens in enumerate(sets):
            t = np.asarray(tokens, dtype=np.int64)
            if t.size and (t.min() < 0 or t.max() >= vocab_size):
                raise ValueError("token ids must be in [0, vocab_size)")
            np.bitwise_or.at(packed[i], t >> 5, np.left_shift(1, t & 31).astype(np.uint32))
        return cls.from_packed(packed.view(np.int32), vocab_size)

    def __len__(self) -> int:
        return int(self.dense_row.shape[0])

    @property
    def width(self) -> int:
        return words_for(self.vocab_size)

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, name).nbytes for name in ARRAYS)

    @property
    def packed_nbytes(self) -> int:
        """Bytes the same sets would take as packed rows."""
        return len(self) * self.width * 4

    def counts(self) -> np.ndarray:
        """int64 [M]: the number of tokens in each set."""
        out = np.diff(self.offsets)
        out[self.complement] = self.vocab_size - out[self.complement]
        packed = self.dense_row >= 0
        dense = np.bitwise_count(self.dense.view(np.uint32)).sum(axis=1, dtype=np.int64)
        out[packed] = dense[self.dense_row[packed]]
        return out

    def listed(self, i: int) -> np.ndarray:
        """int32: the tokens stored for set `i` (its tokens, or those it lacks)."""
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]

    def is_packed(self, i: int) -> bool:
        return bool(self.dense_row[i] >= 0)

    def tokens_of(self, i: int) -> np.ndarray:
        """int32: the token ids in set `i`, sorted."""
        if self.dense_row[i] >= 0:
            return unpack_row(self.dense[self.dense_row[i]])
        if self.complement[i]:
            return np.setdiff1d(np.arange(self.vocab_size, dtype=np.int32), self.listed(i))
        return self.listed(i).copy()

    def contains(self, i: int, token: int) -> bool:
        if not 0 <= token < self.vocab_size:
            return False
        d = int(self.dense_row[i])
        if d >= 0:
            return bool((int(self.dense[d, token >> 5]) >> (token & 31)) & 1)
        listed = self.listed(i)
        j = int(np.searchsorted(listed, token))
        return (j < listed.size and int(listed[j]) == token) != bool(self.complement[i])

    def first_token(self, i: int) -> int:
        """The lowest token id in set `i`, or -1 when the set is empty."""
        d = int(self.dense_row[i])
        if d >= 0:
            row = self.dense[d]
            nonzero = np.flatnonzero(row)
            if not nonzero.size:
                return -1
            word = int(nonzero[0])
            bits = int(row[word]) & 0xFFFFFFFF
            return 32 * word + (bits & -bits).bit_length() - 1
        listed = self.listed(i)
        if not self.complement[i]:
            return int(listed[0]) if listed.size else -1
        gaps = np.flatnonzero(listed != np.arange(listed.size))
        first = int(gaps[0]) if gaps.size else listed.size
        return first if first < self.vocab_size else -1

    def packed(self, rows: np.ndarray | list[int]) -> np.ndarray:
        """int32 [len(rows), W]: the given sets as packed rows (a new array)."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        out = np.zeros((rows.size, self.width), dtype=np.uint32)  # [R, W]
        out[self.complement[rows]] = full_row(self.vocab_size)
        dense = self.dense_row[rows]
        out[dense >= 0] = self.dense[dense[dense >= 0]].view(np.uint32)
        idx, which = spans(self.offsets, rows)
        tok = self.tokens[idx].astype(np.int64)
        # Listed tokens are distinct within a set, so XOR sets them (or clears them from a
        # complement's full row).
        bits = np.left_shift(1, tok & 31).astype(np.uint32)
        np.bitwise_xor.at(out, (which, tok >> 5), bits)
        return out.view(np.int32)

    def arrays(self) -> dict[str, np.ndarray]:
        """The pool's arrays, named as a table's .npz stores them."""
        return {f"set_{name}": getattr(self, name) for name in ARRAYS}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], vocab_size: int) -> TokenSets:
        pool = cls(vocab_size=vocab_size, **{name: arrays[f"set_{name}"] for name in ARRAYS})
        if pool.offsets.shape[0] != len(pool) + 1 or pool.dense.shape[1:] != (pool.width,):
            raise ValueError("token-set arrays do not fit together: the file is damaged")
        return pool
