"""bench/lazy_dfa.py's NFA and bounds built by compiled code (numba), to time what Python hid.

The Python probe spends microseconds an NFA state. Here the parsed regex becomes a small
program first (Python, linear in the regex: sequences, alternatives, repetitions with their
counts, byte-range classes), and numba writes the program out into the same Thompson NFA,
state for state, then runs the same reverse 0-1 BFS for each state's bytes to acceptance.
`bench.lazy_dfa` times both parts beside the Python ones, checks that the two NFAs have the
same states and the same distances, and builds regexes too long for the Python probe this
way alone.
"""

from __future__ import annotations

import re._constants as sre
from typing import Any

import numba as nb
import numpy as np

from bench.lazy_dfa import MAX_CODEPOINT, Unsupported, _class_ranges, utf8_sequences

SEQ, ALT, REP, SET = 0, 1, 2, 3
UNBOUNDED = -1


class Program:
    """A parsed regex as flat arrays: node k has `kind[k]`, two numbers (a repetition's
    low and high, a set's class), and children `kids[kids_lo[k]:kids_hi[k]]`; class c is the
    byte-range sequences `seq_lo[c]..seq_hi[c]`, sequence s the ranges `rng_at[s]..rng_at[s+1]`."""

    def __init__(self) -> None:
        self.kind: list[int] = []
        self.p0: list[int] = []
        self.p1: list[int] = []
        self.kids_lo: list[int] = []
        self.kids_hi: list[int] = []
        self.kids: list[int] = []
        self.classes: dict[tuple[tuple[int, int], ...], int] = {}
        self.seq_lo: list[int] = []
        self.seq_hi: list[int] = []
        self.rng_at: list[int] = [0]
        self.rng_lo: list[int] = []
        self.rng_hi: list[int] = []

    def _node(self, kind: int, p0: int = 0, p1: int = 0, kids: list[int] | None = None) -> int:
        kids = kids or []
        self.kind.append(kind)
        self.p0.append(p0)
        self.p1.append(p1)
        self.kids_lo.append(len(self.kids))
        self.kids += kids
        self.kids_hi.append(len(self.kids))
        return len(self.kind) - 1

    def _set(self, spans: list[tuple[int, int]]) -> int:
        key = tuple(spans)
        c = self.classes.get(key)
        if c is None:
            c = self.classes[key] = len(self.seq_lo)
            self.seq_lo.append(len(self.rng_at) - 1)
            for lo, hi in spans:
                for seq in utf8_sequences(lo, hi):
                    for a, b in seq:
                        self.rng_lo.append(a)
                        self.rng_hi.append(b)
                    self.rng_at.append(len(self.rng_lo))
            self.seq_hi.append(len(self.rng_at) - 1)
        return self._node(SET, c)

    def seq(self, nodes: Any) -> int:
        """The node of a parsed sequence (as bench.lazy_dfa.Nfa.compile reads it)."""
        kids = []
        for op, av in nodes:
            if op is sre.LITERAL:
                kids.append(self._set([(av, av)]))
            elif op is sre.NOT_LITERAL:
                kids.append(self._set(_class_ranges([(sre.NEGATE, None), (sre.LITERAL, av)])))
            elif op is sre.ANY:
                kids.append(self._set([(0, 9), (11, MAX_CODEPOINT)]))
            elif op is sre.IN:
                kids.append(self._set(_class_ranges(av)))
            elif op is sre.SUBPATTERN:
                if av[1] or av[2]:
                    raise Unsupported("flags")
                kids.append(self.seq(av[3]))
            elif op is sre.BRANCH:
                kids.append(self._node(ALT, kids=[self.seq(alt) for alt in av[1]]))
            elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
                low, high, sub = av
                high = UNBOUNDED if high is sre.MAXREPEAT else high
                kids.append(self._node(REP, low, high, [self.seq(sub)]))
            elif op is sre.AT and av is sre.AT_END:
                continue
            else:
                raise Unsupported(str(op))
        return self._node(SEQ, kids=kids)

    def arrays(self) -> tuple[np.ndarray, ...]:
        return tuple(
            np.array(x, dtype=np.int64)
            for x in (
                self.kind, self.p0, self.p1, self.kids_lo, self.kids_hi, self.kids,
                self.seq_lo, self.seq_hi, self.rng_at, self.rng_lo, self.rng_hi,
            )
        )  # fmt: skip


@nb.njit(cache=True)
def _count(k, kind, p0, p1, kids_lo, kids_hi, kids, seq_lo, seq_hi, rng_at, out):
    """Add node k's states, epsilon edges and byte edges, written out, to out[0:3]."""
    t = kind[k]
    if t == SET:
        out[0] += 1
        for s in range(seq_lo[p0[k]], seq_hi[p0[k]]):
            n = rng_at[s + 1] - rng_at[s]
            out[0] += n - 1
            out[2] += n
        return 0
    if t == SEQ:
        for j in range(kids_lo[k], kids_hi[k]):
            _count(kids[j], kind, p0, p1, kids_lo, kids_hi, kids, seq_lo, seq_hi, rng_at, out)
        return 0
    if t == ALT:
        out[0] += 1
        for j in range(kids_lo[k], kids_hi[k]):
            out[0] += 1
            out[1] += 2
            _count(kids[j], kind, p0, p1, kids_lo, kids_hi, kids, seq_lo, seq_hi, rng_at, out)
        return 0
    sub, low, high = kids[kids_lo[k]], p0[k], p1[k]
    copies = low + (1 if high == UNBOUNDED else high - low)
    if high == UNBOUNDED:
        out[0] += 1
        out[1] += 2
    elif high > low:
        out[0] += 1
        out[1] += high - low + 1
    for _ in range(copies):
        _count(sub, kind, p0, p1, kids_lo, kids_hi, kids, seq_lo, seq_hi, rng_at, out)
    return 0


@nb.njit(cache=True)
def _emit(k, at, kind, p0, p1, kids_lo, kids_hi, kids, seq_lo, seq_hi, rng_at, rng_lo, rng_hi,
          top, eps_src, eps_dst, e_src, e_lo, e_hi, e_dst):  # fmt: skip
    """Write node k out from state `at` (top: next state, epsilon and byte edge); returns
    its end state. The same order of states as bench.lazy_dfa.Nfa.compile."""
    t = kind[k]
    if t == SET:
        end = top[0]
        top[0] += 1
        for s in range(seq_lo[p0[k]], seq_hi[p0[k]]):
            cur = at
            last = rng_at[s + 1] - 1
            for r in range(rng_at[s], rng_at[s + 1]):
                if r == last:
                    to = end
                else:
                    to = top[0]
                    top[0] += 1
                e = top[2]
                e_src[e], e_lo[e], e_hi[e], e_dst[e] = cur, rng_lo[r], rng_hi[r], to
                top[2] += 1
                cur = to
        return end
    if t == SEQ:
        for j in range(kids_lo[k], kids_hi[k]):
            at = _emit(kids[j], at, kind, p0, p1, kids_lo, kids_hi, kids, seq_lo, seq_hi,
                       rng_at, rng_lo, rng_hi, top,
                       eps_src, eps_dst, e_src, e_lo, e_hi, e_dst)  # fmt: skip
        return at
    if t == ALT:
        end = top[0]
        top[0] += 1
        for j in range(kids_lo[k], kids_hi[k]):
            s = top[0]
            top[0] += 1
            eps_src[top[1]], eps_dst[top[1]] = at, s
            top[1] += 1
            e = _emit(kids[j], s, kind, p0, p1, kids_lo, kids_hi, kids, seq_lo, seq_hi,
                      rng_at, rng_lo, rng_hi, top,
                      eps_src, eps_dst, e_src, e_lo, e_hi, e_dst)  # fmt: skip
            eps_src[top[1]], eps_dst[top[1]] = e, end
            top[1] += 1
        return end
    sub, low, high = kids[kids_lo[k]], p0[k], p1[k]
    for _ in range(low):
        at = _emit(sub, at, kind, p0, p1, kids_lo, kids_hi, kids, seq_lo, seq_hi,
                   rng_at, rng_lo, rng_hi, top,
                   eps_src, eps_dst, e_src, e_lo, e_hi, e_dst)  # fmt: skip
    if high == UNBOUNDED:
        loop = top[0]
        top[0] += 1
        eps_src[top[1]], eps_dst[top[1]] = at, loop
        top[1] += 1
        e = _emit(sub, loop, kind, p0, p1, kids_lo, kids_hi, kids, seq_lo, seq_hi,
                  rng_at, rng_lo, rng_hi, top,
                  eps_src, eps_dst, e_src, e_lo, e_hi, e_dst)  # fmt: skip
        eps_src[top[1]], eps_dst[top[1]] = e, loop
        top[1] += 1
        return loop
    if high > low:
        end = top[0]
        top[0] += 1
        for _ in range(high - low):
            eps_src[top[1]], eps_dst[top[1]] = at, end
            top[1] += 1
            at = _emit(sub, at, kind, p0, p1, kids_lo, kids_hi, kids, seq_lo, seq_hi,
                       rng_at, rng_lo, rng_hi, top,
                       eps_src, eps_dst, e_src, e_lo, e_hi, e_dst)  # fmt: skip
        eps_src[top[1]], eps_dst[top[1]] = at, end
        top[1] += 1
        return end
    return at


@nb.njit(cache=True)
def _distances(n, accept, eps_src, eps_dst, e_src, e_dst):
    """Each state's fewest bytes to `accept`: the reverse graph in CSR, then a BFS by
    layers, each layer closed over epsilon edges first."""
    inf = 1 << 30
    eps_at = np.zeros(n + 1, dtype=np.int64)
    byte_at = np.zeros(n + 1, dtype=np.int64)
    for i in range(eps_dst.size):
        eps_at[eps_dst[i] + 1] += 1
    for i in range(e_dst.size):
        byte_at[e_dst[i] + 1] += 1
    eps_at = np.cumsum(eps_at)
    byte_at = np.cumsum(byte_at)
    eps_from = np.empty(eps_src.size, dtype=np.int64)
    byte_from = np.empty(e_src.size, dtype=np.int64)
    fill = eps_at[:-1].copy()
    for i in range(eps_dst.size):
        eps_from[fill[eps_dst[i]]] = eps_src[i]
        fill[eps_dst[i]] += 1
    fill = byte_at[:-1].copy()
    for i in range(e_dst.size):
        byte_from[fill[e_dst[i]]] = e_src[i]
        fill[e_dst[i]] += 1
    dist = np.full(n, inf, dtype=np.int64)
    layer = np.empty(n, dtype=np.int64)
    nxt = np.empty(n, dtype=np.int64)
    dist[accept] = 0
    layer[0] = accept
    size, d = 1, 0
    while size:
        i = 0
        while i < size:  # the layer closed over epsilon edges (appended as found)
            t = layer[i]
            for j in range(eps_at[t], eps_at[t + 1]):
                q = eps_from[j]
                if dist[q] > d:
                    dist[q] = d
                    layer[size] = q
                    size += 1
            i += 1
        count = 0
        for i in range(size):
            t = layer[i]
            for j in range(byte_at[t], byte_at[t + 1]):
                q = byte_from[j]
                if dist[q] > d + 1:
                    dist[q] = d + 1
                    nxt[count] = q
                    count += 1
        layer, nxt = nxt, layer
        size, d = count, d + 1
    return dist


def _write(program: Any, root: int) -> tuple[int, int, tuple[np.ndarray, ...]]:
    """The program written out (numba): (states, accepting state, edge arrays)."""
    (kind, p0, p1, kids_lo, kids_hi, kids, seq_lo, seq_hi, rng_at, rng_lo, rng_hi) = (
        program.arrays()
    )
    counts = np.zeros(3, dtype=np.int64)
    _count(root, kind, p0, p1, kids_lo, kids_hi, kids, seq_lo, seq_hi, rng_at, counts)
    n, n_eps, n_edges = int(counts[0]) + 1, int(counts[1]), int(counts[2])
    eps_src, eps_dst = np.empty(n_eps, np.int64), np.empty(n_eps, np.int64)
    e_src, e_lo = np.empty(n_edges, np.int64), np.empty(n_edges, np.int64)
    e_hi, e_dst = np.empty(n_edges, np.int64), np.empty(n_edges, np.int64)
    top = np.array([1, 0, 0], dtype=np.int64)  # state 0 is the start
    accept = _emit(root, 0, kind, p0, p1, kids_lo, kids_hi, kids, seq_lo, seq_hi,
                   rng_at, rng_lo, rng_hi, top,
                   eps_src, eps_dst, e_src, e_lo, e_hi, e_dst)  # fmt: skip
    if top[0] != n or top[1] != n_eps or top[2] != n_edges:
        raise AssertionError("the count and the written NFA disagree")
    return n, int(accept), (eps_src, eps_dst, e_src, e_lo, e_hi, e_dst)


def compiled_nfa(program: Any, root: int) -> tuple[int, int, np.ndarray]:
    """Write the program out (numba): (states, accepting state, bytes to accept per state).
    `program`: a Program, or bench/lazy_parse.CompiledProgram (the same arrays)."""
    n, accept, (eps_src, eps_dst, e_src, _, _, e_dst) = _write(program, root)
    return n, accept, _distances(n, accept, eps_src, eps_dst, e_src, e_dst)


def as_python_nfa(program: Any, root: int) -> tuple[Any, int]:
    """The written-out NFA as bench.lazy_dfa.Nfa (for its LazyDfa) and its accepting state."""
    from bench.lazy_dfa import Nfa

    n, accept, (eps_src, eps_dst, e_src, e_lo, e_hi, e_dst) = _write(program, root)
    nfa = Nfa()
    nfa.eps = [[] for _ in range(n)]
    nfa.edges = [[] for _ in range(n)]
    for q, t in zip(eps_src.tolist(), eps_dst.tolist(), strict=True):
        nfa.eps[q].append(t)
    for q, a, b, t in zip(
        e_src.tolist(), e_lo.tolist(), e_hi.tolist(), e_dst.tolist(), strict=True
    ):
        nfa.edges[q].append((a, b, t))
    return nfa, accept
