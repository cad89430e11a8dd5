"""A byte DFA determinized from a regex's NFA only where walks go, and a LazyTable over it.

outlines-core determinizes a regex's whole byte DFA before the first mask: on large schemas
that is seconds (the 153 of the dev split over 50 ms at 200k: p50 267 ms, p90 2.2 s, p99
12 s), while a first mask reads 3-18 of its states (bench/lazy_reach.py). A GrowingDfa holds
the NFA (compiler/grown/regex_nfa.py) and makes a DFA state, a set of NFA states, only when a
walk first reads a byte out of it: its row of 256 successors is built then, each new set
becoming a new state whose row waits for its own first read. Dead NFA states (no bytes to
acceptance) are left out of every set, so a set that would hold only those is no state: its
transitions are -1, as in a whole byte DFA.

A set accepts what its members accept, so its byte distances are the least of its members':
the same two bounds a LazyTable reads from a whole byte DFA (compiler/grown/byte_bounds.py), each
state's as soon as it exists. A GrowingLazyTable is a LazyTable whose walks read a
GrowingDfa (the LazyTable's resumable walk, which stops at a row not built yet); its masks
and budgets are a whole table's (tests/compiler/grown/test_lazy_dfa.py walks them beside
compile_constraint's).

State 0 is the start state, as in compiler/whole/byte_dfa.py's DFAs; ids otherwise follow the
order walks made them, so they differ from outlines-core's.
"""

from __future__ import annotations

import array

import numba as nb
import numpy as np

from gclm.compiler.grown.lazy_table import NEEDS_WHOLE_TABLE, LazyTable
from gclm.compiler.grown.path_bound import nfa_path
from gclm.compiler.grown.regex_nfa import MAX_NFA_STATES, Nfa, build_nfa
from gclm.compiler.numba_cache import cache_per_version
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.tables import UNREACHABLE

cache_per_version(__file__)

NOT_BUILT = -2  # a row no walk has read yet
_DEAD = int(UNREACHABLE)  # an NFA state with no bytes to acceptance


class GrownRows:
    """The rows and bounds of a byte DFA made as it is read, which a LazyTable walks:
    `next[s, b]` is the state byte b leads to from s (-1: none), once `built[s]`; by state,
    `accepting_list` (0 / 1), `upper_list` (fewest bytes along single-byte tokens) and
    `lower_list` (fewest bytes / the longest token's, rounded up). A subclass makes the
    states (GrowingDfa below, compiler/grown/pushdown.py's PushdownDfa)."""

    def __init__(self, longest: int) -> None:
        self._longest = max(longest, 1)
        self.next = np.full((64, 256), NOT_BUILT, dtype=np.int32)
        self.built = np.zeros(64, dtype=np.bool_)
        self.accepting_list = array.array("b")
        self.upper_list = array.array("i")
        self.lower_list = array.array("i")

    def _new_row(self, every: int, single: int, accepting: bool) -> int:
        """A new state's id, with its bounds from its distances `every` (any bytes) and
        `single` (single-byte tokens); `next` and `built` grown to hold its row."""
        state = len(self.accepting_list)
        if state == self.built.size:
            grown = np.full((2 * state, 256), NOT_BUILT, dtype=np.int32)
            grown[:state] = self.next
            self.next = grown
            self.built = np.concatenate([self.built, np.zeros(state, dtype=np.bool_)])
        self.accepting_list.append(accepting)
        self.upper_list.append(single)
        self.lower_list.append(
            int(UNREACHABLE) if every >= UNREACHABLE else -(-every // self._longest)
        )
        return state

    @property
    def longest(self) -> int:
        """The longest token's bytes (at least 1)."""
        return self._longest

    def expand(self, state: int) -> None:
        """Build row `state` (the subclass's determinization)."""
        raise NotImplementedError

    def accepts(self, data: bytes) -> bool:
        """Whether `data` leads from the start state to an accepting one (rows built as
        they are read): the automaton's language, for checks."""
        state = 0
        for byte in data:
            if not self.built[state]:
                self.expand(state)
            state = int(self.next[state, byte])
            if state < 0:
                return False
        return bool(self.accepting_list[state])


class GrowingDfa(GrownRows):
    """A byte DFA made of `nfa` as it is read (GrownRows); `expand(s)` builds row s.
    `longest`: the longest token's bytes, for the lower bound."""

    def __init__(self, nfa: Nfa, longest: int) -> None:
        super().__init__(longest)
        self.nfa = nfa
        self._ids: dict[bytes, int] = {}
        self._members: list[np.ndarray] = []
        self._member_bytes = 0  # of the sets in _members (kept twice: as keys too)
        self._stamp = np.zeros(nfa.states, dtype=np.int64)  # _row's visited marks
        self._visit = np.zeros(1, dtype=np.int64)
        start = _closure(np.zeros(1, dtype=np.int64), nfa.eps_at, nfa.eps_to, nfa.every,
                         self._stamp, self._visit)  # fmt: skip
        every, single, accepting = _bounds(start, nfa.every, nfa.single, nfa.accept)
        self._add(start, every, single, bool(accepting), start.tobytes())

    @property
    def states(self) -> int:
        return len(self._members)

    def expand(self, state: int) -> None:
        """Build row `state`: each byte's set of NFA states, a new DFA state when new."""
        nfa = self.nfa
        starts, ends, set_at, sets, bounds = _row(
            self._members[state], nfa.eps_at, nfa.eps_to, nfa.byte_at, nfa.byte_lo,
            nfa.byte_hi, nfa.byte_to, nfa.every, nfa.single, nfa.accept, self._stamp,
            self._visit,
        )  # fmt: skip
        targets = []
        for i, (every, single, accepting) in enumerate(bounds.tolist()):
            members = sets[set_at[i] : set_at[i + 1]]
            key = members.tobytes()
            found = self._ids.get(key)
            if found is None:
                found = self._add(members, every, single, bool(accepting), key)
            targets.append(found)
        row = self.next[state]  # after the adds: they may have grown `next`
        row[:] = -1
        for i, target in enumerate(targets):
            row[starts[i] : ends[i]] = target
        self.built[state] = True

    def _add(
        self, members: np.ndarray, every: int, single: int, accepting: bool, key: bytes
    ) -> int:
        """A new state for the set `members` (`key`: its bytes), whose least distances to
        acceptance are `every` (any bytes) and `single` (single-byte tokens)."""
        state = self._new_row(every, single, accepting)
        self._members.append(members)
        self._member_bytes += members.nbytes
        self._ids[key] = state
        return state

    @property
    def nbytes(self) -> int:
        """The NFA, the rows and bounds so far, and the sets of NFA states."""
        sets = self._member_bytes
        return self.nfa.nbytes + self._stamp.nbytes + self.next.nbytes + 2 * sets


class GrowingLazyTable(LazyTable):
    """A LazyTable whose byte DFA grows as its walks read it (see the module docstring)."""

    def __init__(self, dfa: GrowingDfa, vocab: TokenVocabulary) -> None:
        """Raises ValueError as LazyTable does: when the NFA reaches acceptance through a
        byte that is no token by itself, or the start state cannot reach it."""
        self._setup(vocab)
        every, single = dfa.nfa.every, dfa.nfa.single
        if not np.array_equal(every == UNREACHABLE, single == UNREACHABLE):
            raise ValueError(NEEDS_WHOLE_TABLE)
        self.grown = dfa
        # The lists grow with the DFA: a new state's bounds are there as soon as it exists.
        self.upper = self._upper_list = dfa.upper_list
        self.lower = self._lower_list = dfa.lower_list
        self._accepting_list = dfa.accepting_list
        self._columns = np.arange(256, dtype=np.int64)  # a row is 256 bytes wide
        self._stamp = np.full(64, -1, dtype=np.int64)
        self._slot = np.zeros(64, dtype=np.int64)

    @classmethod
    def of_regex(
        cls, regex: str, vocab: TokenVocabulary, max_states: int = MAX_NFA_STATES
    ) -> GrowingLazyTable:
        """The table of `regex` (gclm's regex dialect) over `vocab`.

        Raises regex_parse.Unsupported for a regex the compiled parser does not read (or
        an NFA of more than `max_states`), ValueError as the constructor does."""
        from gclm.compiler.grown.byte_bounds import single_byte_tokens
        from gclm.compiler.vocab.trie import token_trie

        nfa = build_nfa(regex, single_byte_tokens(vocab), max_states)
        return cls(GrowingDfa(nfa, token_trie(vocab).max_depth), vocab)

    def _readable(self) -> tuple[np.ndarray, np.ndarray]:
        """The DFA's rows so far; the walk's marks made room for every state made."""
        dfa = self.grown
        if self._stamp.size < dfa.states:
            more = max(self._stamp.size, dfa.states - self._stamp.size)
            self._stamp = np.concatenate([self._stamp, np.full(more, -1, np.int64)])
            self._slot = np.concatenate([self._slot, np.zeros(more, np.int64)])
        return dfa.next, dfa.built

    def _build_row(self, state: int) -> None:
        self.grown.expand(state)

    def _shortest_path(self, state: int) -> np.ndarray:
        """Read out of the NFA, from the nearest member of `state`'s set."""
        dfa, nfa = self.grown, self.grown.nfa
        members = dfa._members[state]
        start = int(members[np.argmin(nfa.single[members])])
        return nfa_path(
            start, nfa.accept, nfa.eps_at, nfa.eps_to, nfa.byte_at, nfa.byte_lo, nfa.byte_hi,
            nfa.byte_to, nfa.single, self._single_bytes, dfa._stamp, dfa._visit,
        )  # fmt: skip

    def stored_dfa(self) -> None:
        """None: a part of a DFA is not worth a file; the NFA takes milliseconds to build."""
        return None

    @property
    def nbytes(self) -> int:
        """Bytes held: the growing DFA with its NFA, the walked states' groups, the packed
        rows they share."""
        return self.grown.nbytes + self._held + self._stamp.nbytes + self._slot.nbytes


@nb.njit(cache=True, nogil=True)
def _closure(seeds, eps_at, eps_to, every, stamp, visit):
    """The live NFA states `seeds` reach by epsilon edges, sorted (dead states have no live
    successors, so they are neither kept nor followed)."""
    visit[0] += 1
    mark = visit[0]
    stack = np.empty(max(seeds.size, 16), dtype=np.int64)
    out = np.empty(16, dtype=np.int64)
    size = count = 0
    for q in seeds:
        if stamp[q] != mark and every[q] != _DEAD:
            stamp[q] = mark
            stack[size] = q
            size += 1
    while size:
        size -= 1
        q = stack[size]
        if count == out.size:
            out = np.concatenate((out, np.empty(out.size, dtype=np.int64)))
        out[count] = q
        count += 1
        for j in range(eps_at[q], eps_at[q + 1]):
            t = eps_to[j]
            if stamp[t] != mark and every[t] != _DEAD:
                stamp[t] = mark
                if size == stack.size:
                    stack = np.concatenate((stack, np.empty(stack.size, dtype=np.int64)))
                stack[size] = t
                size += 1
    return np.sort(out[:count])


@nb.njit(cache=True, nogil=True)
def _bounds(members, every, single, accept):
    """A set's least `every` and `single` distances, and 1 if it holds `accept` (else 0)."""
    least_every = least_single = _DEAD
    holds = 0
    for q in members:
        least_every = min(least_every, every[q])
        least_single = min(least_single, single[q])
        holds |= q == accept
    return least_every, least_single, holds


@nb.njit(cache=True, nogil=True)
def _row(
    members, eps_at, eps_to, byte_at, byte_lo, byte_hi, byte_to, every, single, accept, stamp,
    visit,
):  # fmt: skip
    """Row of the set `members`: bytes [starts[i], ends[i]) lead to the set
    `sets[set_at[i]:set_at[i + 1]]` (only intervals whose set is not empty), whose least
    `every` and `single` distances and whether it holds `accept` are `bounds[i]`."""
    n_edges = 0
    for q in members:
        n_edges += byte_at[q + 1] - byte_at[q]
    lo = np.empty(n_edges, dtype=np.int64)
    hi = np.empty(n_edges, dtype=np.int64)
    to = np.empty(n_edges, dtype=np.int64)
    e = 0
    for q in members:
        for j in range(byte_at[q], byte_at[q + 1]):
            lo[e], hi[e], to[e] = byte_lo[j], byte_hi[j] + 1, byte_to[j]
            e += 1
    cuts = np.unique(np.concatenate((lo, hi)))  # every interval between cuts is uniform
    starts = np.empty(cuts.size, dtype=np.int64)
    ends = np.empty(cuts.size, dtype=np.int64)
    set_at = np.zeros(cuts.size + 1, dtype=np.int64)
    sets = np.empty(0, dtype=np.int64)
    bounds = np.empty((cuts.size, 3), dtype=np.int64)
    seeds = np.empty(n_edges, dtype=np.int64)
    m = 0
    for c in range(cuts.size - 1):
        a, b = cuts[c], cuts[c + 1]
        n = 0
        for i in range(n_edges):
            if lo[i] <= a and b <= hi[i]:
                seeds[n] = to[i]
                n += 1
        if n == 0:
            continue
        found = _closure(seeds[:n], eps_at, eps_to, every, stamp, visit)
        if found.size == 0:
            continue
        starts[m], ends[m] = a, b
        bounds[m, 0], bounds[m, 1], bounds[m, 2] = _bounds(found, every, single, accept)
        sets = np.concatenate((sets, found))
        set_at[m + 1] = sets.size
        m += 1
    return starts[:m], ends[:m], set_at[: m + 1], sets, bounds[:m]
