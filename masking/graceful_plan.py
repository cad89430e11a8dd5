"""Where a table's slots are, for the graceful policy (masking/graceful.py): built once per
table and vocabulary, read at every step of a budget-aware row.

A *slot* is a state with a free choice (string content or its closing quote, an optional
property or `}`, an array item or `]`); `ahead[s]` is a lookahead over the table's
distances, the slots on the shortest way from `s` to the end. The arrays are Python lists
so that a step reads scalars without NumPy's per-call cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
import torch

from gclm.compiler import CompiledTable, TokenSets, scalars

BLANK = frozenset(b" \t\n\r")
_NO_BYTE = BLANK | {-1}
_DIGITS = frozenset(b"0123456789")
# The first bytes a number's states allow: digits, sign, point, exponent, and what may
# follow a number (a comma, a closing brace or bracket).
_NUMBER = _DIGITS | frozenset(b"-+.eE,}]")
_CLOSERS = frozenset(b"}]")
_COMMA = frozenset(b",")
# Where a row's token ids are used: "numpy" (indexing the numpy view of a CPU row), or the
# device of a tensor row.
Where: TypeAlias = "str | torch.device"


def on(ids: np.ndarray, where: Where) -> np.ndarray | torch.Tensor:
    return ids if where == "numpy" else torch.from_numpy(ids).to(where)


def _sets_with(token_sets: TokenSets, ids: Sequence[int], chunk: int = 256) -> np.ndarray:
    """bool [num_sets]: whether each set holds one of `ids`, by bit tests on packed rows
    (once per table; a chunk of rows at a time keeps the packed copy small)."""
    out = np.zeros(len(token_sets), dtype=bool)
    want = np.asarray(ids, dtype=np.int64)
    if not want.size:
        return out
    words, shifts = want >> 5, (want & 31).astype(np.uint32)
    for lo in range(0, len(token_sets), chunk):
        rows = token_sets.packed(np.arange(lo, min(lo + chunk, len(token_sets))))
        out[lo : lo + rows.shape[0]] = ((rows[:, words] >> shifts) & 1).any(axis=1)
    return out


# Sets of at most this many tokens keep their id tensor in the plan (they are most sets).
_LISTED = 4096


class TablePlan:
    """A table's arrays as Python lists, for per-step scalar access, and where its slots
    are (built once per table and vocabulary).

    A slot is a state with a free choice: its tokens begin with at least two different
    bytes other than blanks (string content, an optional property or `}`, an array item
    or `]`), unless they are a number's (digits, a sign, a point, an exponent, a closer):
    the digits of a number are not content a reader misses. `ahead[s]` counts the slots
    on the shortest way from `s` to the end, `s` excluded; `slots` those of the whole
    output (at least 1).
    """

    def __init__(
        self,
        table: CompiledTable,
        first_bytes: Sequence[int],
        blanks: int,
        empty_ids: Sequence[int],
    ) -> None:
        self.token_sets = table.token_sets
        self.min_tokens = table.min_tokens
        self.dist = scalars(table.dist)
        self.maxsucc = scalars(table.max_next_dist)
        self.offsets = scalars(table.group_offsets)
        self.group_next = scalars(table.group_next)
        self.group_set = scalars(table.group_set)
        self.size = scalars(table.token_sets.counts())
        self._ids: dict[tuple[int, Where], np.ndarray | torch.Tensor] = {}
        self.slot = self._slots(first_bytes, blanks)
        # set index -> whether it has an empty literal; state -> whether it allows one
        with_empty = _sets_with(table.token_sets, empty_ids)
        self.skips = scalars(with_empty)
        total = np.concatenate([[0], np.cumsum(with_empty[table.group_set], dtype=np.int64)])
        hits = total[table.group_offsets[1:]] - total[table.group_offsets[:-1]]
        self._has_empty = scalars(hits > 0)
        self.ahead = self._ahead()
        self.slots = max(1, self.ahead[table.initial] + self.slot[table.initial])

    def has_empty(self, state: int) -> bool:
        """Whether a token allowed in `state` writes an empty literal ("", [], {})."""
        return bool(self._has_empty[state])

    def solid(self, index: int) -> bool:
        """Whether set `index` has a token other than a blank."""
        return bool(self.begins[index]) if self.begins else self.size[index] > self.blanks

    def _slots(self, first_bytes: Sequence[int], blanks: int) -> list[bool]:
        num_states = len(self.dist)
        self.blanks = blanks
        # set index -> the bytes its tokens begin with, blanks excluded (bytes known only)
        self.begins: dict[int, frozenset[int]] = {}
        self.opened = [False] * num_states
        if not first_bytes:  # bytes unknown: a state with content is a slot
            out = []
            for s in range(num_states):
                lo, hi = self.offsets[s], self.offsets[s + 1]
                here = self.dist[s]
                out.append(
                    any(
                        self.dist[n] > here or (self.dist[n] == here and self.size[i] > blanks)
                        for n, i in zip(self.group_next[lo:hi], self.group_set[lo:hi], strict=True)
                    )
                )
            return out
        first = np.asarray(first_bytes, dtype=np.int64)
        begins = self.begins
        seen: list[frozenset[int]] = []
        after_digit = [False] * num_states
        for s in range(num_states):
            lo, hi = self.offsets[s], self.offsets[s + 1]
            here = set[int]()
            for n, index in zip(self.group_next[lo:hi], self.group_set[lo:hi], strict=True):
                if index not in begins:
                    ids = self.token_sets.tokens_of(index)
                    ids = ids[ids < first.size]
                    begins[index] = frozenset(np.unique(first[ids]).tolist()) - _NO_BYTE
                here |= begins[index]
                if begins[index] and begins[index] <= _DIGITS:
                    after_digit[n] = True
            seen.append(frozenset(here))
        # A container just opened: it may close (`]`, `}`) or take its first item or key
        # (after an item only a comma or the closer follows).
        self.opened = [bool(b & _CLOSERS and b - _CLOSERS - _COMMA) for b in seen]
        # A number's states: where it starts (digits or a sign, nothing closes yet) and
        # after a digit. The first state of an array of numbers (`[`: digits or `]`) is a
        # slot.
        return [
            len(b) >= 2
            and not (b & _DIGITS and b <= _NUMBER and (after_digit[s] or not b & _CLOSERS))
            for s, b in enumerate(seen)
        ]

    def _ahead(self) -> list[int]:
        """Slots on the shortest way to the end from each state, the state excluded; an
        empty literal on the way ("" in one token) is a slot it skips, and counts."""
        dist = self.dist
        ahead = [0] * len(dist)
        for s in sorted(range(len(dist)), key=dist.__getitem__):
            if dist[s] <= 0:
                continue
            lo, hi = self.offsets[s], self.offsets[s + 1]
            for n, index in zip(self.group_next[lo:hi], self.group_set[lo:hi], strict=True):
                if dist[n] == dist[s] - 1:
                    ahead[s] = max(ahead[s], ahead[n] + self.slot[n] + self.skips[index])
        return ahead

    def tokens(self, index: int, where: Where) -> np.ndarray | torch.Tensor:
        """int64 token ids of set `index`, for a row `where` (cached for small sets)."""
        ids = self._ids.get((index, where))
        if ids is None:
            ids = on(self.token_sets.tokens_of(index).astype(np.int64), where)
            if self.size[index] <= _LISTED:
                self._ids[index, where] = ids
        return ids
