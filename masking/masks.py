"""Packed token bitmasks for one compiled table: the engine-level half of masking.

A mask row is `ceil(V / 32)` int32 words; bit `v % 32` of word `v // 32` is set when token `v`
may be sampled. Two kinds of row exist:

- forward rows: every token with a transition, plus EOS in accepting states. The table
  already stores each state's forward mask (EOS excluded) in its deduplicated pool; here
  they get the EOS bit and are deduplicated again by (mask, accepting), once per table.
- tight rows: forward rows without the tokens whose successor cannot reach acceptance in
  the budget left. They are only needed where the budget bites, i.e. when
  `r - 1 < max_next_dist[s]` (the largest distance-to-acceptance among `s`'s successors).
  A state's tight rows form a short ladder, one rung per distinct successor distance below
  the largest (each rung the previous one OR the groups at that distance), so the whole
  ladder is built at once, the first time the state needs one; a lookup is then a bisect,
  cached by `(state, r - 1)`. Tables whose ladders all fit in `DEFAULT_EAGER_TIGHT_BYTES`
  get every ladder when their MaskTable is built, so sampling never builds a row.

`mask_table(table)` returns the table's `MaskTable`, built on first use and cached beside the
table for as long as the table lives.
"""

from __future__ import annotations

import weakref
from bisect import bisect_right

import numpy as np

from compiler.errors import InternalError
from compiler.tables import CompiledTable, popcount_rows, words_for

# Tight rows kept per table before the cache is dropped and rebuilt on demand.
DEFAULT_TIGHT_CACHE_BYTES = 256 << 20
# Tables whose tight rows all fit in this many bytes build them up front.
DEFAULT_EAGER_TIGHT_BYTES = 32 << 20
# (state, r - 1) lookups remembered per table; past this the memo starts over (the ladders
# stay, so a forgotten lookup costs one bisect).
_MAX_TIGHT_KEYS = 1 << 16


def num_words(vocab_size: int) -> int:
    """int32 words in one mask row for a vocabulary of `vocab_size` tokens."""
    return words_for(vocab_size)


def set_bit(row: np.ndarray, token: int) -> None:
    """Set one token's bit in an int32 row (through a uint32 view: bit 31 is the sign)."""
    row.view(np.uint32)[token >> 5] |= np.uint32(1 << (token & 31))


class MaskTable:
    """Forward rows for every state, tight rows on demand, for one CompiledTable.

    Holds the table's arrays but not the table itself, so caching it in a WeakKeyDictionary
    keyed by the table does not keep the table alive.
    """

    def __init__(
        self,
        table: CompiledTable,
        *,
        tight_cache_bytes: int = DEFAULT_TIGHT_CACHE_BYTES,
        eager_tight_bytes: int = DEFAULT_EAGER_TIGHT_BYTES,
    ) -> None:
        if not 0 <= table.eos_token_id < table.vocab_size:
            raise ValueError(
                f"eos_token_id {table.eos_token_id} is outside the vocabulary "
                f"(size {table.vocab_size}); the table was compiled for another tokenizer."
            )
        self.vocab_size = table.vocab_size
        self.eos_token_id = table.eos_token_id
        self.width = num_words(table.vocab_size)
        if table.masks.shape[1] != self.width:
            raise ValueError(
                f"The table's masks have {table.masks.shape[1]} words per row, not {self.width}."
            )
        self._masks = table.masks
        self._group_offsets = table.group_offsets
        self._group_next = table.group_next
        self._group_mask = table.group_mask
        self._dist = table.dist

        self.maxsucc = table.max_next_dist  # int32 [S], -1 where no token leaves
        # Python lists: the hot path indexes them one scalar at a time, which lists do faster.
        self._maxsucc = self.maxsucc.tolist()
        self._dist_list = table.dist.tolist()
        self._accepting_list = table.accepting.tolist()
        self._has_tokens = (np.diff(table.group_offsets) > 0).tolist()
        # (mask row, next state) per state, largest token set first: advancing tests one bit
        # per group, and most sampled tokens belong to the largest group.
        size = popcount_rows(table.masks)[table.group_mask]  # [G]
        src = np.repeat(np.arange(table.num_states), np.diff(table.group_offsets))  # [G]
        order = np.lexsort((-size, src))
        gmask, gnext = table.group_mask[order].tolist(), table.group_next[order].tolist()
        pairs = list(zip(gmask, gnext, strict=True))
        bounds = table.group_offsets.tolist()
        self._groups_by_size = [pairs[bounds[s] : bounds[s + 1]] for s in range(table.num_states)]

        # One forward row per distinct (pool row, accepting) pair: the EOS bit is the only
        # difference between a state's forward row and its pool row.
        key = table.state_mask.astype(np.int64) * 2 + table.accepting  # [S]
        uniq, inverse = np.unique(key, return_inverse=True)
        rows = table.masks[uniq >> 1]  # [U, W], a copy
        eos = self.eos_token_id
        rows.view(np.uint32)[np.flatnonzero(uniq & 1), eos >> 5] |= np.uint32(1 << (eos & 31))
        rows.flags.writeable = False
        self.rows = rows
        self.row_of_state = inverse.reshape(-1).astype(np.int32)  # [S]
        views = list(rows)
        self._state_rows = [views[u] for u in self.row_of_state.tolist()]

        self._tight_limit = max(1, tight_cache_bytes // (self.width * 4))
        self._tight_rows = 0  # rungs held in self._ladders
        self._ladders: dict[int, tuple[list[int], list[np.ndarray | None]]] = {}
        self._tight: dict[tuple[int, int], np.ndarray] = {}  # (s, r-1) -> row
        eos_only = np.zeros(self.width, dtype=np.int32)
        set_bit(eos_only, self.eos_token_id)
        eos_only.flags.writeable = False
        self._eos_only = eos_only
        if self.tight_bytes_estimate(table) <= min(eager_tight_bytes, tight_cache_bytes):
            for state in np.flatnonzero(self.maxsucc >= 0).tolist():
                self._ladder(state)

    def tight_bytes_estimate(self, table: CompiledTable) -> int:
        """Bytes of every tight row of the table: one per (state, distinct successor
        distance below the state's largest)."""
        src = np.repeat(np.arange(table.num_states), np.diff(table.group_offsets))  # [G]
        succ = table.dist[table.group_next].astype(np.int64)  # [G]
        below = succ < self.maxsucc[src]
        rungs = np.unique(src[below] * (int(succ.max(initial=0)) + 1) + succ[below]).size
        return rungs * self.width * 4

    @property
    def num_rows(self) -> int:
        """Distinct forward rows (after deduplication)."""
        return int(self.rows.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes of the forward rows, the state index and the tight rows cached so far."""
        tight = self._tight_rows * self.width * 4
        return self.rows.nbytes + self.row_of_state.nbytes + self.maxsucc.nbytes + tight

    def forward_row(self, state: int) -> np.ndarray:
        """int32 [W]: every token with a transition from `state`, EOS if accepting."""
        return self._state_rows[state]

    def row(self, state: int, tokens_left: int) -> np.ndarray:
        """int32 [W]: tokens allowed in `state` with `tokens_left` tokens left, counting the
        one about to be sampled (EOS is free).

        Raises InternalError when the budget is below the state's distance to acceptance,
        i.e. no allowed token is left: sampling from that row would produce NaN.
        """
        k = tokens_left - 1
        if k >= self._maxsucc[state]:
            return self._state_rows[state]
        if tokens_left < self._dist_list[state]:
            raise InternalError(
                f"No token is allowed: state {state} needs {self._dist_list[state]} more "
                f"tokens but only {tokens_left} are left. The budget was not checked against "
                "the constraint's minimum (BudgetTooSmallError) before generation."
            )
        row = self._tight.get((state, k))
        if row is None:
            levels, rungs = self._ladder(state)
            row = rungs[bisect_right(levels, k) - 1]
            if row is None:  # unreachable after the distance check above
                raise InternalError(f"Tight mask for state {state} at budget {k + 1} is empty.")
            if len(self._tight) >= _MAX_TIGHT_KEYS:
                self._tight.clear()
            self._tight[(state, k)] = row
        return row

    def _ladder(self, state: int) -> tuple[list[int], list[np.ndarray | None]]:
        """Budget levels of `state` (-1, then each successor distance below the largest),
        and the row allowed at each: rung i holds the groups at distances <= levels[i]."""
        ladder = self._ladders.get(state)
        if ladder is not None:
            return ladder
        lo, hi = int(self._group_offsets[state]), int(self._group_offsets[state + 1])
        succ = self._dist[self._group_next[lo:hi]]  # [G_s]
        rows = self._group_mask[lo:hi]  # [G_s]
        accepting = self._accepting_list[state]
        levels: list[int] = [-1]
        rungs: list[np.ndarray | None] = [self._eos_only if accepting else None]
        acc = self._eos_only.copy() if accepting else np.zeros(self.width, dtype=np.int32)
        for level in np.unique(succ)[:-1].tolist():  # the top level is the forward row
            for g in rows[succ == level].tolist():
                np.bitwise_or(acc, self._masks[g], out=acc)
            rung = acc.copy()
            rung.flags.writeable = False
            levels.append(level)
            rungs.append(rung)
        built = len(rungs) - 1  # rung 0 is shared
        if self._tight_rows and self._tight_rows + built > self._tight_limit:
            # Ladders are cheap to rebuild; a bounded cache beats an unbounded one.
            self.clear_tight()
        self._tight_rows += built
        self._ladders[state] = levels, rungs
        return levels, rungs

    def clear_tight(self) -> None:
        """Drop every cached tight row (they are rebuilt on demand)."""
        self._ladders.clear()
        self._tight.clear()
        self._tight_rows = 0

    def next_state(self, state: int, token: int) -> int:
        """The state `token` leads to from `state`, or -1 when it is not allowed (EOS
        included). One bit test per successor group, largest group first."""
        if not 0 <= token < self.vocab_size:
            return -1
        word, bit = token >> 5, token & 31
        masks = self._masks
        for row, nxt in self._groups_by_size[state]:
            # Python ints shift arithmetically, so bit 31 (the sign) reads right too.
            if (int(masks[row, word]) >> bit) & 1:
                return nxt
        return -1

    def is_accepting(self, state: int) -> bool:
        return self._accepting_list[state]

    def has_tokens(self, state: int) -> bool:
        """Whether any non-EOS token leaves `state`."""
        return self._has_tokens[state]

    def dist(self, state: int) -> int:
        return self._dist_list[state]


_CACHE: weakref.WeakKeyDictionary[CompiledTable, MaskTable] = weakref.WeakKeyDictionary()


def mask_table(table: CompiledTable) -> MaskTable:
    """The table's MaskTable, built on first use and cached while the table lives.

    The build is O(G + U*W) (groups, distinct forward rows times words) plus the eager tight
    rows: a few milliseconds for a JSON schema. Call it when the table is compiled, to keep
    the build off the sampling hot path.
    """
    masks = _CACHE.get(table)
    if masks is None:
        masks = _CACHE[table] = MaskTable(table)
    return masks
