"""A grammar's masks with a stack: recursion inside rules served with no depth cap.

compiler/front/grammar/frames.py gives a Lark grammar as frames: frame 0 the output, one
frame per rule on a cycle of calls, each a tree of regex parts and calls. Here:

- `build_rtn` writes every frame into one NFA over bytes (a recursive transition network):
  regex parts are compiler/grown/regex_nfa.py's NFAs, spliced; a call is an edge that
  names the frame and the state to return to. Each state's fewest bytes to the end of its
  own frame (`every`; `single` along bytes that are tokens by themselves) counts a call as
  its frame's shortest string, found as a fixed point over the frames.
- `PushdownDfa` determinizes it only where walks go, as compiler/grown/lazy_dfa.py's
  GrowingDfa does a regex's NFA, with one difference: an NFA state is a configuration, a
  state and a stack of return states (interned, shared by every configuration on it). A
  call pushes its return state, the end of a frame pops one. A DFA state is a set of
  configurations: the readings of the text so far that can still finish. Its byte
  distance is exact, the least over its configurations of the state's own distance plus
  those of every return state on its stack: the bytes that close every open frame. A
  state is kept as a base stack and the configurations above it, so that a row made at
  one depth serves every depth (`PushdownDfa`).
- `PushdownTable` is a LazyTable over it (compiler/grown/lazy_table.py): the same trie
  walks, rows and groups. No whole table exists, so budgets are decided by a sound bound
  rather than the exact token distance: a state fits in k tokens when its shortest way to
  acceptance along single-byte tokens (every byte-level vocabulary has all 256) is at most
  k bytes, or when a search found a token path that short (remembered for every state on
  it, so that each step of it fits again). A token whose successor could finish in time
  only through longer tokens may be refused; the output is still always complete within
  max_tokens. The request's minimum is searched exactly from the start state, bounded
  (PUSHDOWN_SEARCH_STATES and the request's deadline); past that bound it is the byte
  bound. docs/guarantee.md says which is which.
- A walk is taken over rather than walked again: each row records how far down its
  stack it read (`PushdownDfa.levels`), a walk the least level of the rows it read, and a
  state with the same local set whose base holds the same returns down to that level
  takes that walk's token groups, its successors put on its own base
  (`PushdownTable._walk`; tests/compiler/grown/test_pushdown_walks.py checks the masks
  against walking every state). One more level of a list is then lookups, not a walk of
  the vocabulary.

Walls: a DFA state holds at most MAX_CONFIGURATIONS configurations (an ambiguous grammar's
readings), a table at most MAX_PUSHDOWN_STATES states; past either a CompileLimitError is
raised. The stack is as deep as the output nests, which the budget bounds.
"""

from __future__ import annotations

import heapq
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.deadline import check
from gclm.compiler.front.grammar.frames import (
    Call,
    Chain,
    Choice,
    GrammarFrames,
    Loop,
    Part,
    left_recursion_error,
)
from gclm.compiler.front.grammar.rx import Rx
from gclm.compiler.front.json_schema.calls import FIRST_CALL_CHAR
from gclm.compiler.grown.lazy_dfa import GrowingLazyTable, GrownRows
from gclm.compiler.grown.lazy_table import _DEADLINE, NEEDS_WHOLE_TABLE, Walked
from gclm.compiler.grown.regex_nfa import Nfa, NfaTooLarge, build_nfa
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.tables import UNREACHABLE
from gclm.errors import CompileLimitError, ConstraintError, InternalError

_INF = int(UNREACHABLE)
# The characters that call a frame from a regex part (compiler/front/json_schema/calls.py).
_CALL_CHARS = re.compile("[\U000f0000-\U000fffff]")
# NFA states of all frames together.
MAX_RTN_STATES = 200_000
# Configurations in one DFA state: the readings an ambiguous grammar keeps open at once.
MAX_CONFIGURATIONS = 4_096
# DFA states of one table (a row of 256 int32 each, and its configurations): ~0.15 GB;
# deep outputs in bench/pushdown.py made 2-9 states a token.
MAX_PUSHDOWN_STATES = 100_000
# The longest shortest output whose fewest-token spelling is found for the request's
# minimum (a byte a step down the table, then a walk a token); past it, its bytes.
SPELLED_BYTES = 4_096
# Walked states a state of the same shape may take its walk from (each tried in turn).
SHAPE_SOURCES = 8
# States a search for the request's minimum may walk (each walk makes the states its
# tokens reach: 0.2-5 ms a state here).
PUSHDOWN_SEARCH_STATES = 64


@dataclass(frozen=True)
class Rtn:
    """Frame f runs from `starts[f]` to `ends[f]`; frame 0's end is the one accepting
    state. Out of state q: epsilon edges `eps[q]`, byte edges `edges[q]` (lo, hi
    inclusive, target), calls `calls[q]` (frame, return state). `every[q]` / `single[q]`:
    the fewest bytes (along single-byte tokens) from q to the end of its frame;
    `shortest[f]` / `shortest_single[f]`: frame f's."""

    states: int
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    eps: list[list[int]]
    edges: list[list[tuple[int, int, int]]]
    calls: list[list[tuple[int, int]]]
    every: list[int]
    single: list[int]
    shortest: list[int]
    shortest_single: list[int]

    @property
    def accept(self) -> int:
        return self.ends[0]


def build_rtn(
    frames: GrammarFrames, single_bytes: np.ndarray, max_states: int = MAX_RTN_STATES
) -> Rtn:
    """The frames' NFA and distances.

    Raises ConstraintError where the start rule generates no string or the empty one, or
    frames call each other before writing a character; CompileLimitError past
    `max_states`."""
    b = _Writer(single_bytes, max_states, len(frames.bodies) if frames.text_calls else 0)
    starts = [b.new() for _ in frames.bodies]
    ends = [b.new() for _ in frames.bodies]
    for f, body in enumerate(frames.bodies):
        if body is not None:
            b.part(body, starts[f], ends[f])
    usable = np.concatenate([[0], np.cumsum(single_bytes.astype(np.int64))])

    def spelled(lo: int, hi: int) -> bool:
        return bool(usable[hi + 1] > usable[lo])

    every, shortest = _distances(b, starts, ends, lambda lo, hi: True)
    single, shortest_single = _distances(b, starts, ends, spelled)
    if shortest[0] >= _INF:
        raise ConstraintError(
            "The Lark grammar's start rule generates no string: every alternative calls a "
            "rule that never ends (a recursion with no alternative that stops it). Give each "
            "recursive rule an alternative without itself.",
        )
    if shortest[0] == 0:
        raise ConstraintError(
            "The Lark grammar matches the empty string, which gclm cannot compile "
            "faithfully. Make `start` need at least one token, e.g. `item+` instead of "
            "`item*`.",
        )
    rtn = Rtn(
        b.count, tuple(starts), tuple(ends), b.eps, b.edges, b.calls, every, single, shortest,
        shortest_single,
    )  # fmt: skip
    cycle = _left_cycle(rtn)
    if cycle:
        raise left_recursion_error(frames, cycle)
    return rtn


class _Writer:
    """Writes frame bodies into NFA states, Thompson's way."""

    def __init__(self, single_bytes: np.ndarray, max_states: int, text_calls: int = 0) -> None:
        self.single_bytes = single_bytes
        self.max_states = max_states
        self.text_calls = text_calls  # frames a regex calls by a character (0: none)
        self.count = 0
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[int, int, int]]] = []
        self.calls: list[list[tuple[int, int]]] = []
        self._nfas: dict[str, Nfa] = {}

    def new(self) -> int:
        if self.count >= self.max_states:
            raise self._too_large()
        if not self.count & 0xFFF:
            check()  # a server thread's deadline (compiler/front/deadline.py)
        self.eps.append([])
        self.edges.append([])
        self.calls.append([])
        self.count += 1
        return self.count - 1

    def part(self, part: Part, a: int, z: int) -> None:
        """States from `a` to `z` that read `part`."""
        if isinstance(part, Rx):
            self._regex(part.text, a, z)
        elif isinstance(part, Call):
            self.calls[a].append((part.frame, z))
        elif isinstance(part, Chain):
            at = a
            for item in part.items[:-1]:
                to = self.new()
                self.part(item, at, to)
                at = to
            self.part(part.items[-1], at, z)
        elif isinstance(part, Choice):
            for option in part.options:
                s, t = self.new(), self.new()
                self.eps[a].append(s)
                self.part(option, s, t)
                self.eps[t].append(z)
        elif isinstance(part, Loop):
            self._loop(part, a, z)
        else:  # pragma: no cover
            raise TypeError(f"unexpected frame part {part!r}")

    def _loop(self, loop: Loop, a: int, z: int) -> None:
        at = a
        for _ in range(loop.low):
            to = self.new()
            self.part(loop.part, at, to)
            at = to
        if loop.high is None:
            hub, back = self.new(), self.new()
            self.eps[at].append(hub)
            self.part(loop.part, hub, back)
            self.eps[back].append(hub)
            self.eps[hub].append(z)
            return
        for _ in range(loop.high - loop.low):
            to = self.new()
            self.eps[at].append(z)
            self.part(loop.part, at, to)
            at = to
        self.eps[at].append(z)

    def _regex(self, text: str, a: int, z: int) -> None:
        if not text:
            self.eps[a].append(z)
            return
        nfa = self._nfas.get(text)
        if nfa is None:
            try:
                nfa = build_nfa(text, self.single_bytes, self.max_states - self.count)
            except NfaTooLarge:
                raise self._too_large() from None
            self._nfas[text] = nfa
        if self.count + nfa.states > self.max_states:
            raise self._too_large()
        off = self.count
        for _ in range(nfa.states):
            self.new()
        eps_at, eps_to = nfa.eps_at.tolist(), nfa.eps_to.tolist()
        byte_at, lo, hi, to = (
            nfa.byte_at.tolist(), nfa.byte_lo.tolist(), nfa.byte_hi.tolist(), nfa.byte_to.tolist(),
        )  # fmt: skip
        for q in range(nfa.states):
            self.eps[off + q].extend(off + t for t in eps_to[eps_at[q] : eps_at[q + 1]])
            self.edges[off + q].extend(
                (lo[j], hi[j], off + to[j]) for j in range(byte_at[q], byte_at[q + 1])
            )
        self.eps[a].append(off)
        self.eps[off + nfa.accept].append(z)
        if self.text_calls and _CALL_CHARS.search(text):
            self._calls_in(off, nfa.states)

    def _calls_in(self, first: int, count: int) -> None:
        """Make each call character among states [first, first + count) a call: its four
        bytes (U+F0000 + f for frame f: F3 then three), which the builder writes as a chain
        of single-byte edges for one literal character, become a call edge to the chain's
        end."""
        for q in range(first, first + count):
            kept: list[tuple[int, int, int]] = []
            for lo, hi, t in self.edges[q]:
                calls = self._call_chain(t) if lo == hi == 0xF3 else None
                if calls is None:
                    kept.append((lo, hi, t))
                else:
                    self.calls[q].extend(calls)
            self.edges[q] = kept

    def _call_chain(self, t: int) -> list[tuple[int, int]] | None:
        """The (frame, return state) calls of the chain after byte F3 into `t`, or None
        where it is some other character's bytes."""
        code = 0xF3 & 0x07
        for _ in range(2):
            edges = self.edges[t]
            if len(edges) != 1 or self.eps[t] or self.calls[t]:
                return None
            lo, hi, t = edges[0]
            if lo != hi or not 0x80 <= lo <= 0xBF:
                return None
            code = code << 6 | lo & 0x3F
        if not self.edges[t] or self.eps[t] or self.calls[t]:
            return None
        calls = []
        for lo, hi, end in self.edges[t]:
            frame = (code << 6 | lo & 0x3F) - FIRST_CALL_CHAR
            if lo != hi or not 0x80 <= lo <= 0xBF or not 0 < frame < self.text_calls:
                return None
            calls.append((frame, end))
        return calls

    def _too_large(self) -> CompileLimitError:
        return CompileLimitError(
            f"The grammar's automaton is over gclm's limit of {self.max_states:,} states. "
            "Use fewer alternatives, smaller counts or shorter terminals."
        )


def _distances(
    b: _Writer, starts: list[int], ends: list[int], keep: Callable[[int, int], bool]
) -> tuple[list[int], list[int]]:
    """Each state's fewest bytes to the end of its frame over the byte edges `counts(lo, hi)`
    keeps, a call counting as its frame's shortest string: a fixed point, since a frame's
    shortest string depends on the others' (each round one Dijkstra; the shortest strings
    only fall, and a round that changes none ends it)."""
    radj: list[list[tuple[int, int]]] = [[] for _ in range(b.count)]
    for q in range(b.count):
        for t in b.eps[q]:
            radj[t].append((q, 0))
        for lo, hi, t in b.edges[q]:
            if keep(lo, hi):
                radj[t].append((q, 1))
    shortest = [_INF] * len(starts)
    while True:
        dist = [_INF] * b.count
        heap = [(0, e) for e in ends]
        for e in ends:
            dist[e] = 0
        calls_into: list[list[tuple[int, int]]] = [[] for _ in range(b.count)]
        for q in range(b.count):
            for f, r in b.calls[q]:
                if shortest[f] < _INF:
                    calls_into[r].append((q, shortest[f]))
        popped = 0
        while heap:
            d, v = heapq.heappop(heap)
            popped += 1
            if not popped & 0xFFF:
                check()
            if d > dist[v]:
                continue
            for u, w in radj[v]:
                if d + w < dist[u]:
                    dist[u] = d + w
                    heapq.heappush(heap, (d + w, u))
            for u, w in calls_into[v]:
                if d + w < dist[u]:
                    dist[u] = d + w
                    heapq.heappush(heap, (d + w, u))
        found = [dist[s] for s in starts]
        if found == shortest:
            return dist, shortest
        shortest = found


def _left_cycle(rtn: Rtn) -> list[int]:
    """Frames that call one another before reading a byte, in a cycle ([] if none): a stack
    that would grow without input."""
    left: list[set[int]] = []
    for start in rtn.starts:
        seen = {start}
        todo = [start]
        callees: set[int] = set()
        while todo:
            q = todo.pop()
            nexts = list(rtn.eps[q])
            for g, r in rtn.calls[q]:
                if rtn.shortest[g] >= _INF or rtn.every[r] >= _INF:
                    continue
                callees.add(g)
                if rtn.shortest[g] == 0:
                    nexts.append(r)
            for t in nexts:
                if t not in seen and rtn.every[t] < _INF:
                    seen.add(t)
                    todo.append(t)
        left.append(callees)
    # A cycle in the left-call graph, by an iterative depth-first search (a chain of
    # thousands of rules must not run out of Python's stack).
    colour = [0] * len(left)
    for root in range(len(left)):
        if colour[root]:
            continue
        path = [root]
        todo = [iter(sorted(left[root]))]
        colour[root] = 1
        while todo:
            g = next(todo[-1], None)
            if g is None:
                colour[path.pop()] = 2
                todo.pop()
            elif colour[g] == 1:
                return path[path.index(g) :]
            elif colour[g] == 0:
                colour[g] = 1
                path.append(g)
                todo.append(iter(sorted(left[g])))
    return []


# A configuration seen from a DFA state's base: an NFA state and the return states pushed
# above the base (bottom first). A DFA state's local set is a sorted tuple of them.
Local = tuple[tuple[int, tuple[int, ...]], ...]
# Where a byte leads from a local set, seen from the base: the local set reached (its id),
# the returns it pushes on the base, its `every` and `single` above the base, and whether a
# reading ended a frame at the base (then the base's top return is read: see `expand`).
Target = tuple[int, tuple[int, ...], int, int, bool]
# A local set's row: byte intervals [a, z), the configurations each leads to (seen from
# the base) before the closure, and their Target (None: no reading goes on).
LocalRow = list[tuple[int, int, frozenset[tuple[int, tuple[int, ...]]], Target | None]]


class PushdownDfa(GrownRows):
    """The byte DFA of an Rtn's configurations, made as it is read (compiler/grown/
    lazy_dfa.py's GrownRows, which a LazyTable walks); `expand(s)` builds row s.
    `longest`: the longest token's bytes.

    A DFA state is a set of configurations, kept as a base and a local set: the base is
    the deepest stack every configuration's stack stands on, the local set each one's NFA
    state and the returns above the base. Where a byte leads depends on the local set
    alone until a reading ends a frame at the base, and then on the base's top returns
    only as far as such readings pop. So each local set's row is made once (`_local_row`)
    and the configurations a byte leads to, seen from a base, are closed once (`_target`):
    a state's row at a new depth is dictionary lookups."""

    def __init__(self, rtn: Rtn, longest: int, max_states: int | None = None) -> None:
        super().__init__(longest)
        self.rtn = rtn
        self.max_states = max_states if max_states is not None else MAX_PUSHDOWN_STATES
        self._n = rtn.states
        # A state is (accepting, local set id, base stack id); by state, the last two.
        self._ids: dict[tuple[bool, int, int], int] = {}
        self._local_of: list[int] = []
        self._base_of: list[int] = []
        self._every: list[int] = []  # by state: its fewest bytes to acceptance
        # By state, once its row is built: the stack depth down to which the row read its
        # base's returns (-1: it read that the stack is empty, where the text may end).
        self.levels = np.zeros(64, dtype=np.int32)
        self._descriptors: dict[int, list[tuple[bool, int, int, tuple[int, ...], int, int]]] = {}
        self._descriptor_count = 0
        self._local_sets: list[Local] = []
        self._local_ids: dict[Local, int] = {}
        self._member_count = 0  # configurations of every local set
        self._local_rows: dict[int, LocalRow] = {}
        self._local_row_count = 0
        self._targets: dict[frozenset[tuple[int, tuple[int, ...]]], Target | None] = {}
        self._target_count = 0  # configurations of every key of `_targets`
        # Stacks, interned: stack 0 is the empty one; stack s is `_ret[s]` on `_parent[s]`.
        self._parent = [-1]
        self._ret = [-1]
        self._depth = [0]
        self._below_every = [0]  # the bytes that close every frame on the stack
        self._below_single = [0]
        self._stacks: dict[tuple[int, int], int] = {}
        self._costs: dict[tuple[int, ...], tuple[int, int]] = {(): (0, 0)}
        # Only configurations that read a byte are kept in a set (with whether the set
        # accepts): the others add nothing to it.
        self._reads = [bool(e) for e in rtn.edges]
        self._ends = frozenset(rtn.ends)
        self._tail = _tails(rtn)
        self._locals: dict[int, tuple[tuple[tuple[int, tuple[int, ...]], ...], bool]] = {}
        self._segments: dict[tuple[int, ...], list[tuple[int, int, tuple[tuple[int, int], ...]]]]
        self._segments = {}
        self._segment_count = 0
        start = self._target(frozenset([(rtn.starts[0], ())]))
        if start is None:  # pragma: no cover - build_rtn refused a start that never ends
            raise InternalError("the grammar's start rule has no live state")
        self._state(start, 0)

    @property
    def states(self) -> int:
        return len(self._local_of)

    @property
    def closures(self) -> int:
        """Configurations closed so far (`_target`, each set once, whatever its depth)."""
        return len(self._targets)

    def depth(self, state: int) -> int:
        """The deepest stack among `state`'s configurations (how deep the output nests)."""
        local = self._local_sets[self._local_of[state]]
        above = max((len(rel) for _, rel in local), default=0)
        return self._depth[self._base_of[state]] + above

    def expand(self, state: int) -> None:
        """Build row `state` from its local set's row: a byte that stays above the base
        leads to that local set on the same base (plus what it pushed). Where a reading
        ends a frame at the base, the base's top return is read: the byte's configurations
        seen from the base below it, as often as that happens (at the empty base, that
        reading is the text's end: the state accepts)."""
        local_row = self._local_rows.get(self._local_of[state])
        if local_row is None:
            local_row = self._local_row(self._local_of[state])
        base = self._base_of[state]
        parent, ret = self._parent, self._ret
        row = np.full(256, -1, dtype=np.int32)
        level = self._depth[base]
        for a, z, seeds, target in local_row:
            on = base
            while target is not None and target[4] and on:
                r, on = ret[on], parent[on]
                seeds = frozenset((t, (r, *rel)) for t, rel in seeds)
                target = self._target(seeds)
            level = min(level, self._depth[on] if on or target is None or not target[4] else -1)
            if target is not None:
                row[a:z] = self._state(target, on)
        self.next[state] = row  # after the adds: they may have grown `next`
        self.levels[state] = level
        self.built[state] = True

    def shape(self, state: int) -> tuple[bool, int]:
        """What `state` is apart from its base: whether it accepts, and its local set."""
        return bool(self.accepting_list[state]), self._local_of[state]

    def base_depth(self, state: int) -> int:
        return self._depth[self._base_of[state]]

    def tops(self, state: int, m: int) -> tuple[int, ...] | None:
        """The top `m` returns of `state`'s base, top first (None: it holds fewer)."""
        stack, out = self._base_of[state], []
        for _ in range(m):
            if not stack:
                return None
            out.append(self._ret[stack])
            stack = self._parent[stack]
        return tuple(out)

    def translate(self, source: int, state: int, successors: list[int]) -> list[int]:
        """The states `successors` of `source` are from `state`, whose local set is
        source's and whose base's top returns are those the rows between them read:
        each one's base seen from source's (so many returns popped, then pushed) is
        put on `state`'s base instead (made if new)."""
        found = self._descriptors.get(source)
        if found is None:
            found = self._descriptors[source] = [self._seen_from(source, t) for t in successors]
            self._descriptor_count += len(found)
        parent, base, out = self._parent, self._base_of[state], []
        for accepting, lid, popped, pushed, every, single in found:
            on = base
            for _ in range(popped):
                on = parent[on]
            for r in pushed:
                on = self._push(on, r)
            t = self._ids.get((accepting, lid, on))
            if t is None:
                every += self._below_every[on]
                single += self._below_single[on]
                t = self._add(lid, on, every, single, accepting)
            out.append(t)
        return out

    def _seen_from(
        self, source: int, state: int
    ) -> tuple[bool, int, int, tuple[int, ...], int, int]:
        """`state` seen from `source`'s base: whether it accepts, its local set, the returns
        popped off source's base and those pushed after, and its distances above its base."""
        depth, parent, ret = self._depth, self._parent, self._ret
        a, b = self._base_of[source], self._base_of[state]
        if self.accepting_list[state]:  # pragma: no cover - its row read the empty stack
            raise InternalError("an accepting state is no other state's successor seen so")
        popped, pushed = 0, []
        while depth[b] > depth[a]:
            pushed.append(ret[b])
            b = parent[b]
        while depth[a] > depth[b]:
            popped += 1
            a = parent[a]
        while a != b:
            pushed.append(ret[b])
            b, a = parent[b], parent[a]
            popped += 1
        on = self._base_of[state]
        every = self._every[state] - self._below_every[on]
        single = self.upper_list[state] - self._below_single[on]
        return False, self._local_of[state], popped, tuple(reversed(pushed)), every, single

    def _state(self, target: Target, base: int) -> int:
        """The state `target` names on `base` (made if new)."""
        lid, ext, every, single, exits = target
        on = base
        for r in ext:
            on = self._push(on, r)
        found = self._ids.get((exits, lid, on))
        if found is not None:
            return found
        if exits:  # at the empty base: the text may end here
            every = single = 0
        else:
            every += self._below_every[base]
            single += self._below_single[base]
        return self._add(lid, on, every, single, exits)

    def _local_row(self, lid: int) -> LocalRow:
        """Local set `lid`'s row, seen from its base, made once."""
        rels: dict[int, list[tuple[int, ...]]] = {}
        for q, rel in self._local_sets[lid]:
            rels.setdefault(q, []).append(rel)
        qs = tuple(sorted(rels))
        segments = self._segments.get(qs)
        if segments is None:
            segments = self._segments[qs] = self._cut(qs)
            self._segment_count += len(segments) + len(qs)
        out = []
        for a, z, pairs in segments:
            seeds = frozenset((t, rel) for q, t in pairs for rel in rels[q])
            out.append((a, z, seeds, self._target(seeds)))
        self._local_rows[lid] = out
        self._local_row_count += len(out)
        return out

    def _target(self, seeds: frozenset[tuple[int, tuple[int, ...]]]) -> Target | None:
        """Where the configurations `seeds` (seen from a base) lead without reading a byte
        (remembered): calls push, frame ends pop, and a frame that ends at the base stops
        that reading (`exits`); the live configurations that read a byte, seen from the
        deepest stack they share, and their least `every` and `single` above the base."""
        if seeds in self._targets:
            return self._targets[seeds]
        every, single = self.rtn.every, self.rtn.single
        seen: set[tuple[int, tuple[int, ...]]] = set()
        kept: set[tuple[int, tuple[int, ...]]] = set()
        least_every = least_single = _INF
        exits = False
        todo = list(seeds)
        while todo:
            item = todo.pop()
            if item in seen:
                continue
            seen.add(item)
            q, rel = item
            items, ends = self._local(q)
            for p, pushes in items:
                conf = (p, rel + pushes) if pushes else (p, rel)
                if conf not in kept:
                    kept.add(conf)
                    cost_every, cost_single = self._cost(conf[1])
                    least_every = min(least_every, every[p] + cost_every)
                    least_single = min(least_single, single[p] + cost_single)
            if len(kept) > MAX_CONFIGURATIONS:
                raise _ambiguous()
            if ends:
                if rel:
                    todo.append((rel[-1], rel[:-1]))
                else:
                    exits = True
        target: Target | None = None
        if kept or exits:
            ext = _common_prefix([rel for _, rel in kept])
            cut = len(ext)
            lid = self._local_id(tuple(sorted((p, rel[cut:]) for p, rel in kept)))
            target = (lid, ext, least_every, least_single, exits)
        self._targets[seeds] = target
        self._target_count += len(seeds)
        return target

    def _cost(self, rel: tuple[int, ...]) -> tuple[int, int]:
        """The bytes that close the frames of returns `rel` (any bytes, single-byte ones)."""
        found = self._costs.get(rel)
        if found is None:
            rtn = self.rtn
            found = self._costs[rel] = (
                sum(rtn.every[r] for r in rel),
                sum(rtn.single[r] for r in rel),
            )
        return found

    def _local_id(self, local: Local) -> int:
        found = self._local_ids.get(local)
        if found is None:
            found = self._local_ids[local] = len(self._local_sets)
            self._local_sets.append(local)
            self._member_count += len(local)
        return found

    def _cut(self, qs: tuple[int, ...]) -> list[tuple[int, int, tuple[tuple[int, int], ...]]]:
        """The byte intervals [a, z) out of the NFA states `qs`, each with the (state,
        target) edges that read it."""
        edges = self.rtn.edges
        spans = [(lo, hi + 1, q, t) for q in qs for lo, hi, t in edges[q]]
        cuts = sorted({x for lo, hi, _, _ in spans for x in (lo, hi)})
        out = []
        for a, z in zip(cuts, cuts[1:], strict=False):
            pairs = tuple((q, t) for lo, hi, q, t in spans if lo <= a and z <= hi)
            if pairs:
                out.append((a, z, pairs))
        return out

    def _push(self, stack: int, ret: int) -> int:
        key = (stack, ret)
        found = self._stacks.get(key)
        if found is None:
            found = len(self._parent)
            self._stacks[key] = found
            self._parent.append(stack)
            self._ret.append(ret)
            self._depth.append(self._depth[stack] + 1)
            self._below_every.append(self._below_every[stack] + self.rtn.every[ret])
            self._below_single.append(self._below_single[stack] + self.rtn.single[ret])
        return found

    def _local(self, q: int) -> tuple[tuple[tuple[int, tuple[int, ...]], ...], bool]:
        """What `q` reaches without reading a byte within its frame: the NFA states that
        read one, each with the return states pushed on the way (calls whose callee ends
        before reading pop theirs again), and whether it reaches its frame's end. A call
        whose return state can only end the frame (`_tail`) pushes nothing: the callee's
        end is the caller's. Found once per state."""
        found = self._locals.get(q)
        if found is not None:
            return found
        rtn = self.rtn
        every, eps, calls, starts = rtn.every, rtn.eps, rtn.calls, rtn.starts
        seen: set[tuple[int, tuple[int, ...]]] = set()
        items: list[tuple[int, tuple[int, ...]]] = []
        ends = False
        todo: list[tuple[int, tuple[int, ...]]] = [(q, ())]
        while todo:
            p, pushes = todo.pop()
            if (p, pushes) in seen or every[p] >= _INF:
                continue
            seen.add((p, pushes))
            if len(seen) > MAX_CONFIGURATIONS:
                raise _ambiguous()
            if self._reads[p]:
                items.append((p, pushes))
            todo.extend((t, pushes) for t in eps[p])
            for f, r in calls[p]:
                if every[r] < _INF and rtn.shortest[f] < _INF:
                    todo.append((starts[f], pushes if self._tail[r] else (*pushes, r)))
            if p in self._ends:
                if pushes:
                    todo.append((pushes[-1], pushes[:-1]))
                else:
                    ends = True
        found = self._locals[q] = (tuple(items), ends)
        return found

    def _add(self, lid: int, base: int, every: int, single: int, accepting: bool) -> int:
        state = len(self._local_of)
        if state >= self.max_states:
            raise CompileLimitError(
                f"The grammar's masks passed gclm's limit of {self.max_states:,} automaton "
                "states in one table (deep or long outputs of a large grammar). Lower "
                "max_tokens or simplify the grammar."
            )
        self._new_row(every, single, accepting)
        if state == self.levels.size:
            self.levels = np.concatenate([self.levels, np.zeros(state, dtype=np.int32)])
        self._local_of.append(lid)
        self._base_of.append(base)
        self._every.append(every)
        self._ids[accepting, lid, base] = state
        return state

    @property
    def nbytes(self) -> int:
        """The rows and bounds so far, each state's key (~150 bytes), the local sets (~72
        bytes a configuration, twice with the key) and their rows (~150 bytes an
        interval), the closures' keys, the successors of walks taken over (~120 bytes
        each), the stacks (~200 bytes each)."""
        return (
            self.next.nbytes + self.built.nbytes + 150 * len(self._local_of)
            + 144 * self._member_count + 150 * self._local_row_count
            + 100 * self._target_count + 120 * self._descriptor_count
            + 200 * len(self._parent) + 400 * self._n + 120 * self._segment_count
        )  # fmt: skip


def _common_prefix(rels: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The longest tuple every one of `rels` starts with."""
    if not rels:
        return ()
    shortest = min(rels, key=len)
    for i, r in enumerate(shortest):
        if any(rel[i] != r for rel in rels):
            return shortest[:i]
    return shortest


def _fewest_tokens(text: bytes, ids: dict[bytes, int], longest: int) -> list[int]:
    """The fewest tokens (ids from `ids`, by bytes, none over `longest` bytes) that spell
    `text`; every single byte must be one (a LazyTable's vocabulary has them all)."""
    best = [0] + [len(text) + 1] * len(text)
    back = [(0, -1)] * (len(text) + 1)
    for end in range(1, len(text) + 1):
        for size in range(1, min(longest, end) + 1):
            token = ids.get(text[end - size : end])
            if token is not None and best[end - size] + 1 < best[end]:
                best[end] = best[end - size] + 1
                back[end] = (end - size, token)
    out: list[int] = []
    at = len(text)
    while at:
        at, token = back[at]
        out.append(token)
    return out[::-1]


def _tails(rtn: Rtn) -> list[bool]:
    """By NFA state: whether it can only end its frame (no byte, no call, every epsilon
    edge to such a state or to the end): a call returning there needs no stack entry."""
    n = rtn.states
    tail = [False] * n
    blocked = [len(e) for e in rtn.eps]  # epsilon successors not known to be tails
    preds: list[list[int]] = [[] for _ in range(n)]
    for q in range(n):
        for t in rtn.eps[q]:
            preds[t].append(q)
    todo = list(rtn.ends)
    for q in todo:
        tail[q] = True
    while todo:
        t = todo.pop()
        for q in preds[t]:
            blocked[q] -= 1
            if blocked[q] == 0 and not tail[q] and not rtn.edges[q] and not rtn.calls[q]:
                tail[q] = True
                todo.append(q)
    return tail


def _ambiguous() -> CompileLimitError:
    return CompileLimitError(
        f"The grammar keeps over {MAX_CONFIGURATIONS:,} readings of one text open at once "
        "(it is ambiguous: several rules match the same characters). Make the alternatives "
        "start differently."
    )


class PushdownTable(GrowingLazyTable):
    """A LazyTable over a PushdownDfa, its budgets decided soundly (see the module
    docstring): `fits` by the single-byte bound or a token path found before; the request's
    minimum searched exactly where that is cheap."""

    # No whole table stands behind it: every request on it is served from it.
    final = True

    def __init__(self, dfa: PushdownDfa, vocab: TokenVocabulary) -> None:  # noqa: D107
        self._setup(vocab)
        rtn = dfa.rtn
        if any((e >= _INF) != (s >= _INF) for e, s in zip(rtn.every, rtn.single, strict=True)):
            raise ValueError(NEEDS_WHOLE_TABLE)
        self.grown = dfa  # type: ignore[assignment]
        self.upper = self._upper_list = dfa.upper_list
        self.lower = self._lower_list = dfa.lower_list
        self._accepting_list = dfa.accepting_list
        self._columns = np.arange(256, dtype=np.int64)
        self._stamp = np.full(64, -1, dtype=np.int64)
        self._slot = np.zeros(64, dtype=np.int64)
        self._witness: dict[int, int] = {}  # state -> tokens of a path found from it
        # By shape (PushdownDfa.shape): states walked, each with how many of its base's
        # returns its walk read and which (`_walk`).
        self._shapes: dict[tuple[bool, int], list[tuple[int, tuple[int, ...], int]]] = {}
        self.shape_sources = SHAPE_SOURCES
        self.walks_taken = 0  # walks taken over from a state of the same shape
        self._minimum: int | None = None
        self._ids_by_bytes = vocab.ids_by_bytes

    @classmethod
    def of_frames(cls, frames: GrammarFrames, vocab: TokenVocabulary) -> PushdownTable:
        """The table of a grammar's frames over `vocab`. Raises as build_rtn does, and
        ValueError where acceptance needs a byte that is no token by itself."""
        from gclm.compiler.grown.byte_bounds import single_byte_tokens
        from gclm.compiler.vocab.trie import token_trie

        rtn = build_rtn(frames, single_byte_tokens(vocab))
        return cls(PushdownDfa(rtn, token_trie(vocab).max_depth), vocab)

    @classmethod
    def of_constraint(cls, constraint: Constraint, vocab: TokenVocabulary) -> PushdownTable | None:
        """The table of a grammar, a JSON Schema or a regex that calls grammars (a tool
        call's), its recursion kept on a stack; or None where there is none to keep, or it
        cannot be kept here (left recursion through several rules, a `$ref` a rewrite must
        read, an automaton past a limit): then the constraint is unrolled into a regex as
        before, which answers with its own table or error. A schema whose recursive
        definitions, written with the others inlined, pass a limit is tried once more with
        every `$ref` a call, and then with its large subschemas split into frames; one
        whose `$ref`s do not recurse, or that has none, is asked for where its regex,
        inlined, passed a limit: every `$ref` a call, then split.

        Raises ConstraintError where the grammar or schema does not read."""
        from gclm.compiler.front.grammar.frames import called_frames, grammar_frames
        from gclm.compiler.front.json_schema.frames import recursive_refs, schema_frames

        if constraint.kind in ("grammar", "regex"):
            if constraint.kind == "grammar":
                frames = grammar_frames(constraint.spec)
            else:  # a tool call's, whose custom tools' grammars recurse
                frames = called_frames(constraint.calls_pattern, constraint.calls)
            if frames is None:
                return None
            try:
                return cls.of_frames(frames, vocab)
            except ConstraintError:
                return None
        if constraint.kind != "json_schema":
            return None
        # A schema whose $refs do not recurse, or that has none, is asked for here when,
        # inlined, its regex passed a limit (server/engine/prepare.py): every $ref a call at
        # once, and past that its large subschemas split into frames.
        refs = '"$ref"' in constraint.spec
        tries = [(True, False)] if refs else []  # (every_ref, split)
        if refs and recursive_refs(json.loads(constraint.spec)):
            tries.insert(0, (False, False))
        tries.append((refs, True))
        for every_ref, split in tries:
            try:
                frames = schema_frames(constraint, every_ref=every_ref, split=split)
                if frames is None:
                    return None
                return cls.of_frames(frames, vocab)
            except CompileLimitError:
                continue
            except ConstraintError:
                return None
        return None

    def _levels(self) -> np.ndarray:
        return self.grown.levels  # type: ignore[attr-defined]

    def _walk(self, state: int) -> Walked:
        """`state`'s walk: a walk of another state is taken over where the two differ only
        below the returns that walk read (same local set, same top returns of the base:
        every row it read reads the same from here), its successors put on this base;
        else walked, and remembered for the states it can serve so."""
        dfa: PushdownDfa = self.grown  # type: ignore[assignment]
        shape = dfa.shape(state)
        for read, tops, source in self._shapes.get(shape, ()):
            if dfa.tops(state, read) == tops:
                walked = self._walked[source]
                nexts = dfa.translate(source, state, walked.next_list)
                upper = max((self._upper_list[n] for n in nexts), default=-1)
                taken = np.array(nexts, dtype=np.int64)
                self._held += taken.nbytes
                self.walks_taken += 1
                return replace(walked, nexts=taken, next_list=nexts, max_upper=upper)
        depth = dfa.base_depth(state)
        self._floor[0] = depth
        walked = super()._walk(state)
        floor = int(self._floor[0])
        same = self._shapes.setdefault(shape, [])
        if floor >= 0 and len(same) < self.shape_sources:
            tops = dfa.tops(state, depth - floor)
            assert tops is not None
            same.append((depth - floor, tops, state))
        return walked

    def spelled_upper(self, state: int) -> int:
        """The sound distance: the single-byte bound, or a token path found from `state`."""
        bound = self._upper_list[state]
        return min(bound, self._witness.get(state, bound))

    def fits(
        self, state: int, k: int, most: int | None = None, deadline: float | None = None
    ) -> bool:
        """Whether `state` is known to finish in at most `k` tokens (never searched here)."""
        return self.spelled_upper(state) <= k

    def dist(self, state: int, most: int | None = None, deadline: float | None = None) -> int:
        """The tokens these masks are sure to finish in from `state` (at least the exact
        distance): what `fits` reads."""
        return self.spelled_upper(state)

    def request_fits(self, budget: int) -> bool:
        return self.request_minimum() <= budget

    def request_minimum(self) -> int:
        """The fewest tokens of any output, searched from the start state at most
        PUSHDOWN_SEARCH_STATES states deep into the table (and within the request's
        deadline); past that, the fewest tokens that spell one shortest output (its bytes,
        when that is longer than SPELLED_BYTES)."""
        if self._minimum is None:
            self._minimum = self._search_minimum(self._spell_shortest())
        return self._minimum

    def _spell_shortest(self) -> int:
        """The tokens of the fewest-token spelling of one shortest output, remembered for
        each state it passes (so that each step of it fits again); the byte bound where
        the output is longer than SPELLED_BYTES or the request's deadline passes."""
        start = self.initial
        bound = self._upper_list[start]
        if not 1 < bound <= SPELLED_BYTES:
            return bound
        deadline = _DEADLINE.get()
        dfa = self.grown
        spelled = np.flatnonzero(self._single_bytes)
        text = bytearray()
        state = start
        while not self._accepting_list[state]:  # down the single-byte bound, a byte a step
            if deadline is not None and time.monotonic() > deadline:
                return bound
            if not dfa.built[state]:
                dfa.expand(state)
            row = dfa.next[state]
            left = self._upper_list[state] - 1
            byte = next(
                (int(b) for b in spelled if row[b] >= 0 and self._upper_list[row[b]] == left),
                None,
            )
            if byte is None:  # pragma: no cover - the bound always has a next byte
                return bound
            text.append(byte)
            state = int(row[byte])
        tokens = _fewest_tokens(bytes(text), self._ids_by_bytes, dfa.longest)
        if len(tokens) >= bound:
            return bound
        path = [start]
        for token in tokens:
            path.append(self.next_state(path[-1], token))
            if path[-1] < 0:  # pragma: no cover - the spelling reads the same bytes
                raise InternalError("a spelling of the shortest output left the automaton")
        for i, state in enumerate(path):
            if len(tokens) - i < self.spelled_upper(state):
                self._witness[state] = len(tokens) - i
        return len(tokens)

    def _search_minimum(self, spelled: int) -> int:
        start = self.initial
        bound = min(self._upper_list[start], spelled)
        deadline = _DEADLINE.get()
        parents: dict[int, int] = {start: -1}
        frontier = [start]
        level = 0
        walked = 0
        while frontier and level + 1 < bound:
            level += 1
            following: list[int] = []
            for s in frontier:
                if walked >= PUSHDOWN_SEARCH_STATES or (
                    deadline is not None and time.monotonic() > deadline
                ):
                    return bound
                walked += 1
                for t in self.walked(s).next_list:
                    if t in parents:
                        continue
                    parents[t] = s
                    if self._accepting_list[t]:
                        self._remember(t, parents, level)
                        return level
                    if self._lower_list[t] + level < bound:
                        following.append(t)
            frontier = following
        return bound

    def _remember(self, end: int, parents: dict[int, int], length: int) -> None:
        """Every state on the path found to `end` fits in the tokens left of it."""
        at, left = end, 0
        while at != -1:
            if left < self.spelled_upper(at):
                self._witness[at] = left
            at, left = parents[at], left + 1
        assert left - 1 == length

    def depth(self, state: int) -> int:
        """How deep the output nests in `state` (its deepest reading)."""
        return self.grown.depth(state)  # type: ignore[attr-defined]
