"""A constraint's masks computed only for the states generation reaches, budget exact.

The whole-table compile (compiler/whole/compile.py) walks the vocabulary through the byte DFA from
every state tokens reach, then computes token distances over the whole token graph, before
the first mask. A LazyTable needs the byte DFA only: the first mask is one walk, from the
start state, and every later state is walked the first time a sequence stands in it.

Budgets stay exact through two bounds per DFA state, both from byte distances (one BFS over
the byte DFA, no tokens):

- an upper bound on the token distance: the fewest bytes to acceptance along bytes that are
  tokens by themselves (every byte-level BPE, tiktoken and byte-fallback vocabulary has all
  256), since such a path can be spelled one single-byte token at a time;
- a lower bound: the fewest bytes at all, divided by the longest token's length, rounded up.

Where both are infinite the state is dead for tokens too. A LazyTable is refused (ValueError)
for a DFA where some state reaches acceptance by bytes but not by single-byte tokens: then
a finite byte distance would not prove a token path (a vocabulary with all 256 single-byte
tokens never hits this; see `single_byte_tokens`).

A token leading to a state whose upper bound fits in the tokens left is allowed without
knowing its exact distance; one whose lower bound does not fit is refused. Only in between,
where the budget binds, is the exact distance needed, found by a breadth-first search over
the token graph from that state, at most as deep as the tokens left, walking the states it
meets (memoised). Tokens into dead states are left out, as the whole-table compile prunes
them. So every mask is the one
the whole table gives: `row(s, r)` allows `v` iff `dist(delta(s, v)) <= r - 1`, EOS iff `s`
accepts (tests/compiler/grown/test_lazy_table.py checks both against compile_constraint).

State ids are the byte DFA's own (compiler/whole/byte_dfa.py: 0 is the start state). Walks share
scratch arrays, so they run under a lock; the compiled walk releases the GIL.
"""

from __future__ import annotations

import array
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np

from gclm.compiler.grown.byte_bounds import byte_bounds, single_byte_tokens
from gclm.compiler.grown.path_bound import dfa_path, fewest_tokens
from gclm.compiler.grown.state_walk import (
    NO_LEVELS,
    clear_rows,
    clear_scratch,
    digest,
    scratch_pairs,
    scratch_rows,
    split_groups,
    walk_trie,
)
from gclm.compiler.grown.text_slice import text_slice, text_target
from gclm.compiler.vocab.trie import TokenTrie, token_trie
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.byte_dfa import ByteDfa
from gclm.compiler.whole.tables import UNREACHABLE, CompiledTable, scalars
from gclm.compiler.whole.token_sets import words_for
from gclm.errors import InternalError

# States a search on a request's way in may walk (its budget check, its exact minimum):
# past them the request is answered from the whole table, which a compile worker makes
# within its own CPU and memory limits. A search that walks the token graph state by state
# cost 0.1-0.3 ms and 1-4 KB a state here; `start: ("a"~1000)~1000` walked 270 k states and
# 1.2 GB in 40 s before this bound.
REQUEST_SEARCH_STATES = 5_000


class SearchTooLarge(Exception):
    """A bounded search (`REQUEST_SEARCH_STATES`) did not decide: ask the whole table."""


_DEADLINE: ContextVar[float | None] = ContextVar("gclm_search_deadline", default=None)


@contextmanager
def request_deadline(deadline: float) -> Iterator[None]:
    """Within it, `request_fits` and `request_minimum` also stop at `deadline`
    (time.monotonic()): a request's searches share its one wait for its tables."""
    token = _DEADLINE.set(deadline)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


NEEDS_WHOLE_TABLE = (
    "The constraint needs a byte that is no token of this vocabulary by itself: "
    "compile its whole table (compile_constraint) instead."
)


def can_serve(dfa: ByteDfa, vocab: TokenVocabulary) -> bool:
    """Whether a LazyTable of `dfa` serves `vocab`: every state that reaches acceptance by
    bytes does so by single-byte tokens, and the start state does (else the whole compile
    answers, with its table or its error)."""
    every, single = byte_bounds(dfa, single_byte_tokens(vocab))
    return bool(
        np.array_equal(every == UNREACHABLE, single == UNREACHABLE) and single[0] != UNREACHABLE
    )


@dataclass(frozen=True)
class Walked:
    """One state's tokens grouped by successor: group g leads to `nexts[g]` on the tokens of
    `groups[g]`. Only successors that can reach acceptance are kept.

    A group is stored as small as it goes: its token ids (int32, sorted) when they take
    fewer bytes than a packed row, else a packed row (uint32 [W]) shared with every equal
    row the table holds, as the forward rows are. Walked rows at 200k tokens were 25 KB
    each, mostly for a few tokens: 36 MB after 284 states of one small schema, 3.8 MB
    stored so."""

    nexts: np.ndarray  # int64 [G]
    groups: tuple[np.ndarray, ...]  # G x (int32 ids [n] | uint32 packed row [W])
    forward: np.ndarray  # int32 [W]: the union of the groups, plus EOS if the state accepts
    max_upper: int  # the largest upper bound among `nexts` (-1 if none): at or past it,
    # the forward row is budget exact
    next_list: list[int]  # `nexts` as Python ints, for the search
    # For `next_state`, one search however many groups: every id-stored group's tokens,
    # sorted (a token leads to one successor), and the group each one is in.
    sparse_ids: np.ndarray  # int32 [n]
    sparse_group: np.ndarray  # int32 [n]


class LazyTable:
    """Masks of one constraint over one vocabulary, walked state by state on demand.

    A mask source (masking/source.py's MaskSource, as a whole table's MaskTable is):
    `forward_row`, `row(state, tokens_left)`, `next_state`, `is_accepting`, `has_tokens`,
    `fits(state, k)` (can `state` reach acceptance in `k` tokens?), `dist`, `upper_bound`
    and the request's `request_fits` and `request_minimum`, found exactly when asked.
    """

    upper: np.ndarray | array.array[int]  # by state: the token distance is at most this
    lower: np.ndarray | array.array[int]  # by state: the token distance is at least this
    # Whether no whole table stands behind it (compiler/grown/pushdown.py's): then every
    # request on its constraint is served from it, budgets and all.
    final = False

    def __init__(self, dfa: ByteDfa, vocab: TokenVocabulary) -> None:
        """Bounds for every state of `dfa`; no state is walked yet.

        Raises ValueError when some state reaches acceptance only through a byte that is
        no token by itself (then use compile_constraint's whole table)."""
        self._setup(vocab)
        self.dfa = dfa
        self._trans = dfa.next  # [S, 256], or [S, K] for a compact DFA
        self._columns = dfa.columns  # [256]: each byte's column of _trans
        self._accepting = dfa.accepting
        every, single = byte_bounds(dfa, single_byte_tokens(vocab))
        if not np.array_equal(every == UNREACHABLE, single == UNREACHABLE):
            raise ValueError(NEEDS_WHOLE_TABLE)
        self.upper = single  # int32 [S]
        longest = max(self._trie.max_depth, 1)
        lower = -(-every.astype(np.int64) // longest)
        lower[every == UNREACHABLE] = UNREACHABLE
        self.lower = lower.astype(np.int32)  # int32 [S]
        self._upper_list = scalars(single)
        self._lower_list = scalars(self.lower)
        self._accepting_list = scalars(dfa.accepting)
        states = dfa.next.shape[0]
        self._built = np.ones(states, dtype=np.bool_)  # every row of a whole DFA is there
        self._stamp = np.full(states, -1, dtype=np.int64)
        self._slot = np.zeros(states, dtype=np.int64)

    def _setup(self, vocab: TokenVocabulary) -> None:
        """What does not depend on the DFA: the vocabulary's trie, and nothing walked yet."""
        self.vocab_size = vocab.size
        self.eos_token_id = vocab.eos_token_id
        self.width = words_for(vocab.size)
        self.initial = 0
        self._trie: TokenTrie = token_trie(vocab)
        self._text = text_slice(vocab)
        self._walked: dict[int, Walked] = {}
        self._rows: dict[int, list[np.ndarray]] = {}  # packed rows by digest (Walked)
        self._held = 0  # bytes of the walked states' groups and of `_rows`
        self._exact: dict[int, int] = {}  # state -> token distance
        self._spelled: dict[int, int] = {}  # state -> its shortest path's fewest tokens
        self._single_bytes = single_byte_tokens(vocab)
        self._beyond: dict[int, int] = {}  # state -> k: its distance is known to exceed k
        self._lock = threading.RLock()
        self._walks = 0
        self._floor = np.zeros(1, dtype=np.int64)  # see `_levels`
        eos_only = np.zeros(self.width, dtype=np.int32)
        eos_only.view(np.uint32)[self.eos_token_id >> 5] |= np.uint32(1 << (self.eos_token_id & 31))
        eos_only.flags.writeable = False
        self._eos_only = eos_only
        # The outcome of the whole table's compile this LazyTable stands in for (its table
        # or its error, past any 429), when the table cache handed it out ahead of it
        # (FirstTables.fetch).
        self.compiled: Future[CompiledTable] | None = None
        # Seconds its own compile (the byte DFA alone) took, when there is no `compiled`.
        self.compile_seconds = 0.0

    # -- what a state allows ----------------------------------------------------------------

    def walked(self, state: int) -> Walked:
        """`state`'s successor groups, walked on first use (thread-safe)."""
        found = self._walked.get(state)
        if found is not None:
            return found
        with self._lock:
            found = self._walked.get(state)
            if found is None:
                found = self._walk(state)
                self._walked[state] = found
        return found

    def _walk(self, state: int) -> Walked:
        try:
            ng, nexts, rows, counts, pairs, n_pairs, whole = self._groups(state)
        except BaseException:
            clear_scratch()  # a walk stopped midway (a grown DFA past its limit)
            raise
        try:
            # Live successors only: with every byte spelled, a finite upper bound is a
            # token path.
            upper = np.array([self._upper_list[n] for n in nexts[:ng].tolist()], dtype=np.int64)
            keep = upper != UNREACHABLE
            forward, dense, ids, owner, span, by_group = split_groups(
                rows, counts[:ng], keep, pairs[0], pairs[1], n_pairs
            )
            by_group.flags.writeable = False
            groups = tuple(
                self._shared(rows[g]) if dense[g] else by_group[span[g] : span[g + 1]]
                for g in np.flatnonzero(keep).tolist()
            )
        finally:
            clear_rows(rows, pairs[0], pairs[1], n_pairs, whole)
        nexts, upper = nexts[:ng][keep], upper[keep]
        if self._accepting_list[state]:
            forward[self.eos_token_id >> 5] |= np.uint32(1 << (self.eos_token_id & 31))
        self._held += nexts.nbytes + by_group.nbytes + ids.nbytes + owner.nbytes
        return Walked(
            nexts,
            groups,
            self._shared(forward.view(np.int32)),
            int(upper.max(initial=-1)),
            nexts.tolist(),
            ids,
            owner,
        )

    def _groups(
        self, state: int
    ) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray], int, int]:
        """The trie walked from `state` (compiler/grown/state_walk.py): (groups, successors
        [>= groups], packed rows, tokens per group, the (token, group) pairs, how many, the
        row the text tokens were added to whole or -1). The rows are the thread's scratch:
        the caller clears them.

        From a state where every text token leads to one state t (compiler/grown/text_slice.py),
        only the other tokens are walked; the text tokens join the group of t."""
        target = self._text_target(state)
        text = target >= 0
        trie = self._text.rest if text else self._trie
        rows = scratch_rows(self.width, 64)
        pairs = scratch_pairs(trie.token_ids.size)
        nexts = np.zeros(rows.shape[0], dtype=np.int64)
        counts = np.zeros(rows.shape[0], dtype=np.int64)
        path = np.empty(trie.max_depth + 1, dtype=np.int64)
        path[0] = state
        self._walks += 1
        k = ng = n_pairs = 0
        while True:
            trans, built = self._readable()
            status, k, ng, n_pairs = walk_trie(
                trans, self._columns, built, trie.byte, trie.depth, trie.skip, trie.token_lo,
                trie.token_ids, k, path, ng, nexts, rows, counts, self._stamp, self._slot,
                self._walks, pairs[0], pairs[1], n_pairs, self._levels(), self._floor,
            )  # fmt: skip
            if status == 1:
                self._build_row(int(path[trie.depth[k] - 1]))
                continue
            if status == 0 and text and self._stamp[target] != self._walks and ng == nexts.size:
                status = 2  # no room for the text's own group
            if status == 2:  # more successors than room: four times the room, on from node k
                more = 3 * nexts.size
                nexts = np.concatenate([nexts, np.zeros(more, np.int64)])
                counts = np.concatenate([counts, np.zeros(more, np.int64)])
                rows = scratch_rows(self.width, 4 * rows.shape[0], rows)
                continue
            if not text:
                return ng, nexts, rows, counts, pairs, n_pairs, -1
            # The text tokens join the group of `target`, or make it.
            if self._stamp[target] != self._walks:
                self._stamp[target], self._slot[target], nexts[ng] = self._walks, ng, target
                ng += 1
            slot = int(self._slot[target])
            rows[slot] |= self._text.row
            counts[slot] += self._text.count
            return ng, nexts, rows, counts, pairs, n_pairs, slot

    def _text_target(self, state: int) -> int:
        """The state every text token leads to from `state`, if one (else -1)."""
        while True:
            trans, built = self._readable()
            status, found = text_target(
                trans, self._columns, built, state, self._levels(), self._floor
            )
            if status != 1:
                return found if status == 0 else -1
            self._build_row(found)

    def _readable(self) -> tuple[np.ndarray, np.ndarray]:
        """The transitions the walk reads, and which states' rows are there (all of them
        for a whole DFA; compiler/grown/lazy_dfa.py's grows)."""
        return self._trans, self._built

    def _levels(self) -> np.ndarray:
        """int32 by state: how far down its stack each row read, for a walk to lower
        `_floor` to (compiler/grown/pushdown.py's; empty: rows that read no stack)."""
        return NO_LEVELS

    def _build_row(self, state: int) -> None:
        raise InternalError(f"state {state} of a whole byte DFA has no row")

    def _shared(self, row: np.ndarray) -> np.ndarray:
        """The one read-only copy of a packed row that the table keeps for its contents
        (found by a digest, so that no second copy is kept as a key)."""
        same = self._rows.setdefault(int(digest(row.view(np.uint32))), [])
        for found in same:
            if found.dtype == row.dtype and np.array_equal(found, row):
                return found
        found = row.copy()
        found.flags.writeable = False
        same.append(found)
        self._held += found.nbytes
        return found

    def forward_row(self, state: int) -> np.ndarray:
        """int32 [W]: every token leading to a live state, EOS if `state` accepts."""
        return self.walked(state).forward

    def row(self, state: int, tokens_left: int) -> np.ndarray:
        """int32 [W]: the tokens allowed in `state` with `tokens_left` left (counting the one
        about to be sampled; EOS is free): those whose successor can still reach acceptance.

        Raises InternalError when no token is allowed (the budget was not checked)."""
        k = tokens_left - 1
        walked = self.walked(state)
        if k >= walked.max_upper:
            return walked.forward
        nexts = walked.next_list
        fit = [g for g, n in enumerate(nexts) if self.fits(n, k)]
        if len(fit) == len(nexts):
            return walked.forward
        accepting = self._accepting_list[state]
        if not fit and not accepting:
            raise InternalError(
                f"No token is allowed: state {state} cannot reach acceptance in {tokens_left} "
                "tokens. The budget was not checked against the constraint's minimum "
                "(BudgetTooSmallError) before generation."
            )
        out = self._eos_only.copy() if accepting else np.zeros(self.width, dtype=np.int32)
        packed = out.view(np.uint32)
        for g in fit:
            group = walked.groups[g]
            if group.dtype == np.uint32:
                packed |= group
            else:
                np.bitwise_or.at(packed, group >> 5, np.uint32(1) << (group & 31).astype(np.uint32))
        return out

    def next_state(self, state: int, token: int) -> int:
        """The state `token` leads to from `state`, or -1 when it is not allowed (EOS: -1)."""
        if not 0 <= token < self.vocab_size or token == self.eos_token_id:
            return -1
        walked = self.walked(state)
        ids = walked.sparse_ids
        at = int(np.searchsorted(ids, token))
        if at < ids.size and ids[at] == token:
            return walked.next_list[walked.sparse_group[at]]
        word, bit = token >> 5, np.uint32(1 << (token & 31))
        for g, group in enumerate(walked.groups):
            if group.dtype == np.uint32 and group[word] & bit:
                return walked.next_list[g]
        return -1

    def is_accepting(self, state: int) -> bool:
        return bool(self._accepting_list[state])

    def has_tokens(self, state: int) -> bool:
        """Whether any non-EOS token leads from `state` to a live state."""
        return self.walked(state).nexts.size > 0

    # -- distances --------------------------------------------------------------------------

    def fits(
        self, state: int, k: int, most: int | None = None, deadline: float | None = None
    ) -> bool:
        """Whether `state` can reach acceptance in at most `k` tokens: by the bounds when
        they decide it, else by a search at most `k` deep (meeting at most `most` states
        before time.monotonic() passes `deadline`: else SearchTooLarge)."""
        if self._upper_list[state] <= k:
            return True
        if self._lower_list[state] > k:
            return False
        exact = self._exact.get(state)
        if exact is not None:
            return exact <= k
        if self._beyond.get(state, -1) >= k:
            return False
        if self.spelled_upper(state) <= k:
            return True
        found = self._search(state, k, most, deadline)
        return found is not None

    def dist(self, state: int, most: int | None = None, deadline: float | None = None) -> int:
        """The exact fewest tokens from `state` to acceptance (searched when not known,
        bounded as in `fits`)."""
        exact = self._exact.get(state)
        if exact is not None:
            return exact
        if self._upper_list[state] == UNREACHABLE:
            return int(UNREACHABLE)
        found = self._search(state, self.spelled_upper(state), most, deadline)
        if found is None:
            raise InternalError(f"state {state} has no token path within its upper bound")
        return found

    def spelled_upper(self, state: int) -> int:
        """An upper bound on `state`'s token distance, at most `upper[state]`: the fewest
        tokens that spell the bytes of one shortest path along single-byte tokens
        (compiler/grown/path_bound.py; found once per state)."""
        found = self._spelled.get(state)
        if found is None:
            upper = self._upper_list[state]
            found = upper
            if 1 < upper < UNREACHABLE:
                with self._lock:
                    spelled = self._shortest_path(state)
                if spelled.size == upper:  # else the bound stays the byte count
                    found = fewest_tokens(spelled, self._trie)
            self._spelled[state] = found
        return found

    def upper_bound(self, state: int) -> int:
        """masking.source.MaskSource's cheap bound: `spelled_upper`."""
        return self.spelled_upper(state)

    def _shortest_path(self, state: int) -> np.ndarray:
        """uint8 [upper[state]]: the bytes of a shortest path from `state` to acceptance
        along single-byte tokens."""
        return dfa_path(self._trans, self._columns, self.upper, self._single_bytes, state)

    @property
    def min_tokens(self) -> int:
        """Fewest tokens of any output (exact; searched on first use)."""
        return self.dist(self.initial)

    def request_fits(self, budget: int) -> bool:
        """`fits(initial, budget)` as a request's way in may search it: SearchTooLarge past
        REQUEST_SEARCH_STATES states or the request's deadline (`request_deadline`)."""
        return self.fits(self.initial, budget, REQUEST_SEARCH_STATES, _DEADLINE.get())

    def request_minimum(self) -> int:
        """`min_tokens` as a request's way in may search it (bounded as `request_fits`)."""
        return self.dist(self.initial, REQUEST_SEARCH_STATES, _DEADLINE.get())

    def _search(
        self, state: int, limit: int, most: int | None = None, deadline: float | None = None
    ) -> int | None:
        """The token distance of `state` if it is at most `limit`, else None (remembered);
        SearchTooLarge once it has met more than `most` states (None: no bound) or the
        clock passed `deadline`."""
        if self._accepting_list[state]:
            self._exact[state] = 0
            return 0
        most = most if most is not None else -1
        clock = deadline is not None
        seen = {state}
        frontier = [state]
        best: int | None = None
        for level in range(1, limit + 1):
            if best is not None and level >= best:
                break
            following: list[int] = []
            for s in frontier:
                if len(seen) > most >= 0 or (clock and time.monotonic() > deadline):  # type: ignore[operator]
                    raise SearchTooLarge(
                        f"the exact search from state {state} met over {most} states, or its "
                        "request's deadline"
                    )
                for n in self.walked(s).next_list:
                    if n in seen:
                        continue
                    seen.add(n)
                    if self._accepting_list[n]:
                        self._exact[state] = level
                        return level
                    known = self._exact.get(n)
                    if known is not None:
                        best = level + known if best is None else min(best, level + known)
                        continue
                    if self._lower_list[n] + level > limit:
                        continue  # cannot finish within the limit from there
                    following.append(n)
            frontier = following
            if not frontier:
                break
        if best is not None and best <= limit:
            self._exact[state] = best
            return best
        self._beyond[state] = max(self._beyond.get(state, -1), limit)
        return None

    def stored_dfa(self) -> bytes | None:
        """The byte DFA as the table cache's disk keeps it (`ByteDfa.to_bytes`)."""
        return self.dfa.to_bytes()

    # -- size -------------------------------------------------------------------------------

    @property
    def num_walked(self) -> int:
        """States walked so far."""
        return len(self._walked)

    @property
    def nbytes(self) -> int:
        """Bytes held: the byte DFA and its bounds, every walked state's groups, and the
        packed rows they share (counted as they are made)."""
        bounds = 2 * 4 * len(self._upper_list)  # upper and lower, int32 a state
        fixed = self._trans.nbytes + self._accepting.nbytes + self._built.nbytes + bounds
        return fixed + self._held + self._stamp.nbytes + self._slot.nbytes
