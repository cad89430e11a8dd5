"""A regex as a Thompson NFA over bytes, and each NFA state's byte distances to acceptance.

compiler/grown/regex_parse.py reads the regex into a program; numba writes the program out, one
copy of a repetition's body per count, but a subtree written from the same state as an
equal one before shares its states (so the NFA is at most linear in the regex with its
counted repetitions expanded, and the regexes of objects with optional properties, which
write each property once per alternative that may hold it, make 2 to 60 times fewer
states). Then a reverse BFS finds each state's fewest bytes to acceptance: over every
byte, and over the bytes that are tokens by themselves. A subset of NFA states accepts what
its members accept, so a subset's distance is the least of its members':
compiler/grown/lazy_dfa.py determinizes the NFA only where walks go, with the same bounds a
LazyTable reads from a whole byte DFA (compiler/grown/byte_bounds.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numba as nb
import numpy as np

from gclm.compiler.grown.regex_parse import ALT, SEQ, SET, UNBOUNDED, ParsedRegex, Unsupported
from gclm.compiler.numba_cache import cache_per_version
from gclm.compiler.whole.tables import UNREACHABLE
from gclm.errors import InternalError


class NfaTooLarge(Unsupported):
    """The regex reads, but its NFA is past the states asked for."""


cache_per_version(__file__)

# A regex whose NFA would pass this is refused (Unsupported): 7.2 M states took 1.9 s and
# about 0.4 GB, more than outlines-core's whole DFA is worth waiting for in the server.
MAX_NFA_STATES = 4_000_000


@dataclass(frozen=True)
class Nfa:
    """State 0 is the start, `accept` the one accepting state. Epsilon edges out of q are
    `eps_to[eps_at[q]:eps_at[q + 1]]`; byte edges out of q are j in `byte_at[q]:byte_at[q+1]`,
    bytes `byte_lo[j]..byte_hi[j]` to `byte_to[j]`. `every[q]` is q's fewest bytes to
    acceptance, `single[q]` the fewest along bytes that are tokens by themselves
    (UNREACHABLE when there are none)."""

    states: int
    accept: int
    eps_at: np.ndarray  # int64 [N + 1]
    eps_to: np.ndarray  # int64 [E]
    byte_at: np.ndarray  # int64 [N + 1]
    byte_lo: np.ndarray  # int64 [B]
    byte_hi: np.ndarray  # int64 [B]
    byte_to: np.ndarray  # int64 [B]
    every: np.ndarray  # int64 [N]
    single: np.ndarray  # int64 [N]

    @property
    def nbytes(self) -> int:
        arrays = (self.eps_at, self.eps_to, self.byte_at, self.byte_lo, self.byte_hi)
        return sum(a.nbytes for a in arrays) + self.byte_to.nbytes + 2 * self.every.nbytes


def build_nfa(regex: str, single_bytes: np.ndarray, max_states: int = MAX_NFA_STATES) -> Nfa:
    """The NFA of `regex` and its distances; `single_bytes` (bool [256]): the bytes that are
    tokens by themselves.

    Raises Unsupported for a construct compiler/grown/regex_parse.py does not read, or an NFA of
    more than `max_states` states."""
    parsed = ParsedRegex(regex)
    n, accept, edges = write_nfa(parsed, parsed.root, max_states, room=len(regex))
    eps_src, eps_dst, e_src, e_lo, e_hi, e_dst = edges
    every = nfa_distances(n, accept, eps_src, eps_dst, e_src, e_dst)
    spelled = np.concatenate([[0], np.cumsum(single_bytes.astype(np.int64))])
    usable = spelled[e_hi + 1] > spelled[e_lo]  # some byte of the edge is a token
    if usable.all():  # every byte-level vocabulary: the same distances
        single = every.copy()
    else:
        single = nfa_distances(n, accept, eps_src, eps_dst, e_src[usable], e_dst[usable])
    eps_at, eps_order = _by_source(n, eps_src)
    byte_at, byte_order = _by_source(n, e_src)
    every[every >= _INF] = UNREACHABLE
    single[single >= _INF] = UNREACHABLE
    return Nfa(
        n, accept, eps_at, eps_dst[eps_order], byte_at, e_lo[byte_order], e_hi[byte_order],
        e_dst[byte_order], every, single,
    )  # fmt: skip


_INF = 1 << 30


@nb.njit(cache=True, nogil=True)
def _by_source(n, src):
    """A counting sort of edges by source: (offsets [n + 1], edge order)."""
    at = np.zeros(n + 1, dtype=np.int64)
    for i in range(src.size):
        at[src[i] + 1] += 1
    at = np.cumsum(at)
    fill = at[:-1].copy()
    order = np.empty(src.size, dtype=np.int64)
    for i in range(src.size):
        order[fill[src[i]]] = i
        fill[src[i]] += 1
    return at, order


_CAP = 1 << 60  # counts saturate here: a count past any limit is as good as infinite


@nb.njit(cache=True, nogil=True)
def _count(k, kind, p0, p1, kids_lo, kids_hi, kids, seq_lo, seq_hi, rng_at, out):
    """Add node k's states, epsilon edges and byte edges, written out, to out[0:3]
    (saturating at _CAP). A repetition's body is counted once and multiplied, so the count
    takes time in the regex's size, not in the NFA's: nested counts can write out more
    states than any machine holds, and the limit must refuse them at once."""
    t = kind[k]
    if t == SET:
        out[0] += 1
        for s in range(seq_lo[p0[k]], seq_hi[p0[k]]):
            n = rng_at[s + 1] - rng_at[s]
            out[0] += n - 1
            out[2] += n
    elif t == SEQ:
        for j in range(kids_lo[k], kids_hi[k]):
            _count(kids[j], kind, p0, p1, kids_lo, kids_hi, kids, seq_lo, seq_hi, rng_at, out)
    elif t == ALT:
        out[0] += 1
        for j in range(kids_lo[k], kids_hi[k]):
            out[0] += 1
            out[1] += 2
            _count(kids[j], kind, p0, p1, kids_lo, kids_hi, kids, seq_lo, seq_hi, rng_at, out)
    else:
        sub, low, high = kids[kids_lo[k]], p0[k], p1[k]
        copies = low + (1 if high == UNBOUNDED else high - low)
        if high == UNBOUNDED:
            out[0] += 1
            out[1] += 2
        elif high > low:
            out[0] += 1
            out[1] += high - low + 1
        body = np.zeros(3, dtype=np.int64)
        _count(sub, kind, p0, p1, kids_lo, kids_hi, kids, seq_lo, seq_hi, rng_at, body)
        for i in range(3):
            if copies > 0 and body[i] > _CAP // copies:
                out[i] = _CAP
            else:
                out[i] += body[i] * copies
    for i in range(3):
        out[i] = min(out[i], _CAP)
    return 0


@nb.njit(cache=True, nogil=True)
def _add_eps(top, eps_src, eps_dst, source, target):
    """Count the epsilon edge source -> target, and write it where there is room (when
    top[4] says the pass writes)."""
    if top[4] and top[1] < eps_src.size:
        eps_src[top[1]], eps_dst[top[1]] = source, target
    top[1] += 1


@nb.njit(cache=True, nogil=True)
def _emit(k, at, kind, p0, p1, kids_lo, kids_hi, kids, seq_lo, seq_hi, rng_at, rng_lo, rng_hi,
          top, eps_src, eps_dst, e_src, e_lo, e_hi, e_dst, shape, written):  # fmt: skip
    """Write node k out from state `at` (top: next state, epsilon and byte edge, the most
    states: past it nothing more is written, and whether to write the edges or only count
    them); returns its end state.

    With `shape` (each node's two 64-bit hashes of its subtree, [nodes, 2]), a node whose
    subtree was written from the same state before is not written again: `written` maps
    its hashes and the state to the end state, which the two uses then share, and
    alternatives start
    at `at` itself. That keeps the language: the two copies would be equal states hung off
    the same state, entered only through it, so a path through the shared states reads a
    word that one copy alone reads too (tests/compiler/grown/test_lazy_dfa.py checks the DFAs
    made of it against outlines-core's, over every byte). Without `shape` (empty), every
    node is written where it occurs, each alternative from a state of its own, left to
    right. (One function, not two calling each other: numba's cache does not load mutually
    recursive functions safely.)"""
    t = kind[k]
    share = shape.shape[0] > 0
    key = np.int64(0)
    check = np.int64(0)
    if share:
        # One int64 key (the first hash and the state, mixed) for a fast map; the value
        # holds the second hash's high half beside the end state, checked on a hit.
        key = np.int64(_mix(shape[k, 0], np.uint64(at)))
        check = np.int64(shape[k, 1] >> np.uint64(33))
        found = written.get(key, np.int64(-1))
        if found >= 0 and (found >> 31) == check:
            return found & 0x7FFFFFFF
    end = at
    if top[0] > top[3]:
        pass  # past the limit: the caller refuses the NFA
    elif t == SET:
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
                if top[4] and top[2] < e_src.size:
                    e = top[2]
                    e_src[e], e_lo[e], e_hi[e], e_dst[e] = cur, rng_lo[r], rng_hi[r], to
                top[2] += 1
                cur = to
    elif t == SEQ:
        for j in range(kids_lo[k], kids_hi[k]):
            end = _emit(kids[j], end, kind, p0, p1, kids_lo, kids_hi, kids, seq_lo, seq_hi,
                        rng_at, rng_lo, rng_hi, top,
                        eps_src, eps_dst, e_src, e_lo, e_hi, e_dst, shape, written)  # fmt: skip
    elif t == ALT:
        end = top[0]
        top[0] += 1
        for j in range(kids_lo[k], kids_hi[k]):
            s = at
            if shape.shape[0] == 0:
                s = top[0]
                top[0] += 1
                _add_eps(top, eps_src, eps_dst, at, s)
            e = _emit(kids[j], s, kind, p0, p1, kids_lo, kids_hi, kids, seq_lo, seq_hi,
                      rng_at, rng_lo, rng_hi, top,
                      eps_src, eps_dst, e_src, e_lo, e_hi, e_dst, shape, written)  # fmt: skip
            _add_eps(top, eps_src, eps_dst, e, end)
    else:
        sub, low, high = kids[kids_lo[k]], p0[k], p1[k]
        cur = at
        for _ in range(low):
            cur = _emit(sub, cur, kind, p0, p1, kids_lo, kids_hi, kids, seq_lo, seq_hi,
                        rng_at, rng_lo, rng_hi, top,
                        eps_src, eps_dst, e_src, e_lo, e_hi, e_dst, shape, written)  # fmt: skip
        end = cur
        if high == UNBOUNDED:
            end = top[0]  # the loop
            top[0] += 1
            _add_eps(top, eps_src, eps_dst, cur, end)
            e = _emit(sub, end, kind, p0, p1, kids_lo, kids_hi, kids, seq_lo, seq_hi,
                      rng_at, rng_lo, rng_hi, top,
                      eps_src, eps_dst, e_src, e_lo, e_hi, e_dst, shape, written)  # fmt: skip
            _add_eps(top, eps_src, eps_dst, e, end)
        elif high > low:
            end = top[0]
            top[0] += 1
            for _ in range(high - low):
                _add_eps(top, eps_src, eps_dst, cur, end)
                cur = _emit(sub, cur, kind, p0, p1, kids_lo, kids_hi, kids, seq_lo, seq_hi,
                            rng_at, rng_lo, rng_hi, top,
                            eps_src, eps_dst, e_src, e_lo, e_hi, e_dst, shape, written)  # fmt: skip
            _add_eps(top, eps_src, eps_dst, cur, end)
    if share:
        written[key] = (check << 31) | end
    return end


@nb.njit(cache=True, nogil=True)
def nfa_distances(n, accept, eps_src, eps_dst, e_src, e_dst):
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


def write_nfa(
    program: Any, root: int, max_states: int | None = None, share: bool = True, room: int = 0
) -> tuple[int, int, tuple[np.ndarray, ...]]:
    """The program written out (numba): (states, accepting state, edge arrays: epsilon
    sources and targets, byte sources, lows, highs and targets). `program`: a ParsedRegex,
    or anything with its `arrays()`. Raises Unsupported past `max_states` states.

    `share`: a subtree written from the same state twice is written once (see _emit). The
    regexes of objects with optional properties write each property's value once per
    alternative that may hold it; as written they start at the same state, so Kubernetes
    kb_1112's 2.4 M characters make 32 k NFA states instead of 1.2 M. Shared, the NFA is
    counted as it is written, into room for most programs' edges, and written again where
    that was short; the count stops at the limit and reads only what it writes, where the
    unshared count reads the whole program. `room`: the edges to make room for first (the
    regex's length is room for most programs' edges; pages left untouched stay free)."""
    arrays = program.arrays()
    if share:
        shape = _shapes(root, *arrays, _SEEDS)
        limit = min(max_states or _MAX_SHARED, _MAX_SHARED)
        room = max(room, 1 << 16)  # else the first pass has counted them, a second writes them
        top, accept, edges = _write(root, arrays, shape, limit, True, room, room)
        n, n_eps, n_edges = (int(x) for x in top)
        if n <= limit and (n_eps > room or n_edges > room):
            top, accept, edges = _write(root, arrays, shape, limit, True, n_eps, n_edges)
    else:
        shape = np.empty((0, 2), dtype=np.uint64)
        counts = np.zeros(3, dtype=np.int64)
        _count(root, *arrays[:9], counts)
        n, n_eps, n_edges = int(counts[0]) + 1, int(counts[1]), int(counts[2])
        limit = max_states if max_states is not None else n
        if n <= limit:
            top, accept, edges = _write(root, arrays, shape, limit, True, n_eps, n_edges)
    if n > limit:
        raise NfaTooLarge(f"an NFA of {'over ' if share else ''}{n} states (at most {limit})")
    if top[0] != n or top[1] != n_eps or top[2] != n_edges:
        raise InternalError("the count and the written NFA disagree")
    return n, accept, tuple(a[: n_eps if i < 2 else n_edges] for i, a in enumerate(edges))


def _write(
    root: int, arrays: tuple[np.ndarray, ...], shape: np.ndarray, limit: int, write: bool,
    n_eps: int = 0, n_edges: int = 0,
) -> tuple[np.ndarray, int, tuple[np.ndarray, ...]]:  # fmt: skip
    """One pass of _emit into room for `n_eps` and `n_edges` edges: (top: states, epsilon
    and byte edges, counted past the room; the accepting state; the edge arrays, written
    up to the room, and only when `write`)."""
    eps_src, eps_dst = np.empty(n_eps, np.int64), np.empty(n_eps, np.int64)
    e_src, e_lo = np.empty(n_edges, np.int64), np.empty(n_edges, np.int64)
    e_hi, e_dst = np.empty(n_edges, np.int64), np.empty(n_edges, np.int64)
    top = np.array([1, 0, 0, limit, write], dtype=np.int64)  # state 0 is the start
    accept = _emit(root, 0, *arrays, top, eps_src, eps_dst, e_src, e_lo, e_hi, e_dst,
                   shape, _written())  # fmt: skip
    return top[:3], int(accept), (eps_src, eps_dst, e_src, e_lo, e_hi, e_dst)


# Two hashes of a subtree, seeded per process: a subtree is taken for another written from
# the same state only when the first hash (mixed with the state, 64 bits) and 31 bits of
# the second agree.
_MAX_SHARED = (1 << 31) - 2  # end states are packed in 31 bits of _emit's map
_SEEDS = np.frombuffer(os.urandom(16), dtype=np.uint64).copy()


@nb.njit(cache=True, nogil=True)
def _written():
    """An empty map for _emit (made in compiled code: from Python it took 70 us)."""
    return nb.typed.Dict.empty(key_type=nb.types.int64, value_type=nb.types.int64)


@nb.njit(cache=True, nogil=True)
def _mix(h, x):
    """splitmix64's finalizer over h and x (uint64)."""
    z = h ^ (x * np.uint64(0x9E3779B97F4A7C15))
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@nb.njit(cache=True, nogil=True)
def _shapes(root, kind, p0, p1, kids_lo, kids_hi, kids, seq_lo, seq_hi, rng_at, rng_lo, rng_hi,
            seeds):  # fmt: skip
    """[root + 1, 2]: each node's subtree hashed twice (from the two seeds): its kind, its
    counts or its class's byte ranges, its children's hashes in order. The parser writes a
    node after its children, so one pass in order sees every child first."""
    out = np.empty((root + 1, 2), dtype=np.uint64)
    for k in range(root + 1):
        t = kind[k]
        for lane in range(2):
            h = _mix(seeds[lane], np.uint64(t))
            if t == SET:
                for q in range(seq_lo[p0[k]], seq_hi[p0[k]]):
                    h = _mix(h, np.uint64(1 << 40) + np.uint64(rng_at[q + 1] - rng_at[q]))
                    for r in range(rng_at[q], rng_at[q + 1]):
                        h = _mix(_mix(h, np.uint64(rng_lo[r])), np.uint64(rng_hi[r]))
            else:
                if t != SEQ and t != ALT:  # a repetition's counts (UNBOUNDED: -1)
                    h = _mix(_mix(h, np.uint64(p0[k] + 2)), np.uint64(p1[k] + 2))
                h = _mix(h, np.uint64(kids_hi[k] - kids_lo[k]))
                for j in range(kids_lo[k], kids_hi[k]):
                    c = kids[j]
                    if c >= k:
                        raise ValueError("a node written before its children")
                    h = _mix(h, out[c, lane])
            out[k, lane] = h
    return out
