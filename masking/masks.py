"""Packed token bitmasks for one compiled table: the engine-level half of masking.

A mask row is `ceil(V / 32)` int32 words; bit `v % 32` of word `v // 32` is set when token `v`
may be sampled. Two kinds of row exist:

- forward rows: every token with a transition, plus EOS in accepting states. The table
  already stores each state's forward set (EOS excluded) in its deduplicated pool; here
  they are packed, get the EOS bit and are deduplicated again by (set, accepting), once
  per table.
- tight rows: forward rows without the tokens whose successor cannot reach acceptance in
  the budget left. They are only needed where the budget bites, i.e. when
  `r - 1 < max_next_dist[s]` (the largest distance-to-acceptance among `s`'s successors).
  A state's tight rows form a short ladder, one rung per distinct successor distance below
  the largest (each rung the previous one OR the groups at that distance), so the whole
  ladder is built at once, the first time the state needs one; a lookup is then a bisect,
  cached by `(state, r - 1)`. Tables whose ladders all fit in `DEFAULT_EAGER_TIGHT_BYTES`
  get every ladder when their MaskTable is built, so sampling never builds a row.

`mask_table(table)` returns the table's `MaskTable`, built on first use and cached beside the
table for as long as the table lives; a MaskTable is a MaskSource (masking/source.py), and
`mask_source(table)` gives the source of a whole table or a lazy one alike.
"""

from __future__ import annotations

import itertools
import sys
import weakref
from bisect import bisect_right
from typing import Any

import numpy as np

from gclm.compiler import CompiledTable, TokenSets, scalars, words_for
from gclm.errors import InternalError
from gclm.masking.source import MaskSource

# Tight rows kept per table before the cache is dropped and rebuilt on demand.
DEFAULT_TIGHT_CACHE_BYTES = 256 << 20
# Tables whose tight rows all fit in this many bytes build them up front.
DEFAULT_EAGER_TIGHT_BYTES = 32 << 20
# (state, r - 1) lookups remembered per table; past this the memo starts over (the ladders
# stay, so a forgotten lookup costs one bisect).
_MAX_TIGHT_KEYS = 1 << 16
# Sets of at most this many listed tokens answer `next_state` from a frozenset (a few KiB at
# most, and faster than a packed row); larger ones from a packed row.
_MAX_SET_TOKENS = 64
# Estimated CPython bytes per state (six list slots, a numpy row view, an empty list, two
# ints past the small-int cache), per tested group (a 3-tuple, its slot, an int) and per
# memoised tight lookup (a dict slot and its (int, int) key).
_PER_STATE_BYTES = 6 * 8 + 112 + 56 + 2 * 28
_PER_GROUP_BYTES = 64 + 8 + 28
_PER_LOOKUP_BYTES = 100 + 56 + 2 * 28
# How `next_state` tests a group's set: a bit of a packed row, in a frozenset, not in one.
_PACKED, _IN, _NOT_IN = 0, 1, 2


def _membership(pool: TokenSets, needed: set[int]) -> tuple[dict[int, tuple[int, object]], int]:
    """How `next_state` tests a token against each needed set of the pool: (_IN or _NOT_IN,
    frozenset) for a short token list, (_PACKED, packed int32 row) for the rest (the pool's
    own row when it is stored packed). Also returns the bytes allocated for them."""
    tests: dict[int, tuple[int, object]] = {}
    to_pack: list[int] = []
    for i in needed:
        if pool.is_packed(i):
            tests[i] = (_PACKED, pool.dense[pool.dense_row[i]])
        elif pool.listed(i).size <= _MAX_SET_TOKENS:
            kind = _NOT_IN if pool.complement[i] else _IN
            tests[i] = (kind, frozenset(pool.listed(i).tolist()))
        else:
            to_pack.append(i)
    packed = pool.packed(to_pack)  # [P, W]
    for i, row in zip(to_pack, packed, strict=True):
        tests[i] = (_PACKED, row)
    sets = sum(sys.getsizeof(obj) for kind, obj in tests.values() if kind != _PACKED)
    return tests, packed.nbytes + sets


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
        self.initial = table.initial
        self.min_tokens = table.min_tokens
        self.width = num_words(table.vocab_size)
        if table.token_sets.vocab_size != self.vocab_size:
            raise ValueError(
                f"The table's token sets cover {table.token_sets.vocab_size} tokens, "
                f"not {self.vocab_size}."
            )
        self._pool = table.token_sets
        self._group_offsets = table.group_offsets
        self._group_next = table.group_next
        self._group_mask = table.group_set
        self._dist = table.dist

        self.maxsucc = table.max_next_dist  # int32 [S], -1 where no token leaves
        # The hot path indexes these one scalar at a time (tables.scalars: nearly as fast
        # as lists, a fraction of their memory).
        self._maxsucc = scalars(self.maxsucc)
        self._dist_list = scalars(table.dist)
        self._accepting_list = scalars(table.accepting)
        self._has_tokens = scalars(np.diff(table.group_offsets) > 0)
        # One forward row per distinct (pool row, accepting) pair: the EOS bit is the only
        # difference between a state's forward row and its pool row.
        key = table.state_set.astype(np.int64) * 2 + table.accepting  # [S]
        uniq, inverse = np.unique(key, return_inverse=True)
        rows = table.token_sets.packed(uniq >> 1)  # [U, W]
        eos = self.eos_token_id
        rows.view(np.uint32)[np.flatnonzero(uniq & 1), eos >> 5] |= np.uint32(1 << (eos & 31))
        rows.flags.writeable = False
        self.rows = rows
        self.row_of_state = inverse.reshape(-1).astype(np.int32)  # [S]
        views = list(rows)
        self._state_rows = [views[u] for u in self.row_of_state.tolist()]

        # A state's groups are disjoint and their union is its forward row, so a token in
        # the forward row that is in none of the smaller groups is in the largest one: the
        # largest group (often nearly the whole vocabulary) needs no test of its own.
        size = table.token_sets.counts()[table.group_set]  # [G]
        src = np.repeat(np.arange(table.num_states), np.diff(table.group_offsets))  # [G]
        order = np.lexsort((-size, src))
        gmask, gnext = table.group_set[order].tolist(), table.group_next[order].tolist()
        bounds = table.group_offsets.tolist()
        self._largest_next = [gnext[b] if b < e else -1 for b, e in itertools.pairwise(bounds)]
        smaller = [i for b, e in itertools.pairwise(bounds) for i in range(b + 1, e)]
        tests, self._test_bytes = _membership(table.token_sets, {gmask[i] for i in smaller})
        triples = [(*tests[gmask[i]], gnext[i]) for i in smaller]
        offsets = np.cumsum([0] + [max(e - b - 1, 0) for b, e in itertools.pairwise(bounds)])
        self._smaller_groups: list[list[tuple[Any, ...]]] = [
            triples[offsets[s] : offsets[s + 1]] for s in range(table.num_states)
        ]

        # The per-state Python lists above, counted so that a cache of MaskTables can be
        # bounded in bytes: list slots, row views, the tuples of the group tests.
        self._list_bytes = table.num_states * _PER_STATE_BYTES + len(smaller) * _PER_GROUP_BYTES
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
        """Bytes of the forward rows, the state index, the group tests, the tight rows and
        lookups cached so far, and (estimated) the per-state Python lists."""
        tight = self._tight_rows * self.width * 4 + len(self._tight) * _PER_LOOKUP_BYTES
        index = self.row_of_state.nbytes + self.maxsucc.nbytes
        return self.rows.nbytes + index + self._test_bytes + tight + self._list_bytes

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
            level_rows = self._pool.packed(rows[succ == level])  # [k, W]
            np.bitwise_or(acc, np.bitwise_or.reduce(level_rows, axis=0), out=acc)
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
        included). A bit test in the forward row, then one test per group but the largest."""
        if not 0 <= token < self.vocab_size or token == self.eos_token_id:
            return -1
        word, bit = token >> 5, token & 31
        # Python ints shift arithmetically, so bit 31 (the sign) reads right too.
        if not (int(self._state_rows[state][word]) >> bit) & 1:
            return -1
        for kind, members, nxt in self._smaller_groups[state]:
            if kind == _PACKED:
                if (int(members[word]) >> bit) & 1:
                    return nxt
            elif (token in members) != (kind == _NOT_IN):
                return nxt
        return self._largest_next[state]

    def is_accepting(self, state: int) -> bool:
        return bool(self._accepting_list[state])

    def has_tokens(self, state: int) -> bool:
        """Whether any non-EOS token leaves `state`."""
        return bool(self._has_tokens[state])

    def dist(self, state: int) -> int:
        return self._dist_list[state]

    def fits(self, state: int, k: int) -> bool:
        """Whether `state` can reach acceptance in at most `k` tokens."""
        return self._dist_list[state] <= k

    def upper_bound(self, state: int) -> int:
        """The distance itself: every state's is known."""
        return self._dist_list[state]

    def request_fits(self, budget: int) -> bool:
        return self.min_tokens <= budget

    def request_minimum(self) -> int:
        return self.min_tokens


_CACHE: weakref.WeakKeyDictionary[CompiledTable, MaskTable] = weakref.WeakKeyDictionary()


def table_memory(table: CompiledTable) -> int:
    """Bytes a table holds while it is cached: its arrays plus its MaskTable (built here if
    it is not yet). The server's table cache counts this against its budget."""
    return table.nbytes + mask_table(table).nbytes


def mask_source(table: CompiledTable | MaskSource) -> MaskSource:
    """What a sequence on `table` masks with: a whole table's MaskTable (`mask_table`), or
    the source itself (a LazyTable walks and masks states as they are reached)."""
    return mask_table(table) if isinstance(table, CompiledTable) else table


def whole_table(table: CompiledTable | MaskSource) -> CompiledTable | None:
    """The whole compiled table behind `table`, or None for a source without one (a
    LazyTable: no plan over every state, no thinking phase)."""
    return table if isinstance(table, CompiledTable) else None


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
