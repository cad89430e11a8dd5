"""Byte DFAs made minimal: unreachable states dropped, states with the same future merged.

outlines-core's DFAs are not minimal, and some regexes write one part many times: an
object whose first properties are optional is one alternative per first property, each
with its own copy of the rest, and the DFA keeps a copy of every later value per
alternative, multiplied at each nested level (MaskBench Github_ultra o12652: 128,813
states where 35,847 do; Github_hard o90821 with other keys allowed anywhere: 46,194 where
7,120 do). The token walk, distances, masks and cached bytes all cost per state.

Moore's partition refinement: states split by acceptance, then, round after round, by the
classes their bytes lead to, until no class splits. A round labels each state with a
64-bit hash of its class and its successors' classes (a hash table numbers the new
classes), so a collision could merge two states that differ: the result is checked exactly
(every state of a class leads each byte into the same class, and agrees on acceptance)
before it is used, and a collision retries with other hash weights.
"""

from __future__ import annotations

import logging

import numba as nb
import numpy as np

from gclm.compiler.numba_cache import cache_per_version
from gclm.compiler.whole.byte_dfa import ByteDfa

cache_per_version(__file__)

log = logging.getLogger("gclm.compiler")

_SEEDS = (0, 1, 2)  # hash weights tried in turn; a second is needed only after a collision


def minimized(dfa: ByteDfa) -> ByteDfa:
    """The minimal DFA of `dfa`'s language, its start state 0, with `dfa`'s layout (a column
    per byte, or per class of bytes if `dfa` is compact). States are numbered in the order
    a breadth-first walk from the start meets them. Returns `dfa` itself when it already is
    minimal."""
    compact = dfa.compact()
    order = _reachable(compact.next)
    table, accepting = _renumbered(compact.next, compact.accepting, order)
    k = table.shape[1]
    for seed in _SEEDS:
        weights = np.random.default_rng(seed).integers(1, 2**63, size=k + 1, dtype=np.uint64)
        classes, count = _refine(table, accepting, weights | np.uint64(1))
        quotient, final, ok = _quotient(table, accepting, classes, count)
        if ok:
            break
        log.warning("DFA minimization: a hash collision (seed %d); retrying", seed)
    else:  # not met in practice: three independent 64-bit collisions
        log.warning("DFA minimization failed %d times; the DFA is kept as built", len(_SEEDS))
        return dfa
    if count == dfa.next.shape[0]:
        return dfa
    if dfa.classes is None:
        quotient = np.ascontiguousarray(quotient[:, compact.columns])
    return ByteDfa(quotient, final, dfa.classes)


@nb.njit(cache=True, nogil=True)
def _reachable(trans):
    """int64 [R]: the states reachable from state 0, in breadth-first order (0 first)."""
    states, columns = trans.shape
    seen = np.zeros(states, dtype=np.bool_)
    order = np.empty(states, dtype=np.int64)
    order[0] = 0
    seen[0] = True
    head, tail = 0, 1
    while head < tail:
        s = order[head]
        head += 1
        for c in range(columns):
            n = trans[s, c]
            if n >= 0 and not seen[n]:
                seen[n] = True
                order[tail] = n
                tail += 1
    return order[:tail]


@nb.njit(cache=True, nogil=True)
def _renumbered(trans, accepting, order):
    """The table and acceptance of the states in `order`, numbered by their place in it."""
    states, columns = trans.shape
    new_id = np.full(states, -1, dtype=np.int32)
    for i in range(order.size):
        new_id[order[i]] = i
    table = np.empty((order.size, columns), dtype=np.int32)
    final = np.empty(order.size, dtype=np.bool_)
    for i in range(order.size):
        s = order[i]
        final[i] = accepting[s]
        for c in range(columns):
            n = trans[s, c]
            table[i, c] = -1 if n < 0 else new_id[n]
    return table, final


@nb.njit(cache=True, nogil=True)
def _refine(table, accepting, weights):
    """(class of each state, number of classes): Moore's refinement, classes numbered in
    the order their first state appears (state 0's class is 0)."""
    states, columns = table.shape
    size = 2
    while size < 2 * states:  # open addressing, at most half full
        size *= 2
    slots, taken = np.empty(size, dtype=np.uint64), np.empty(size, dtype=np.int64)
    classes = np.empty(states, dtype=np.int64)
    hashes = np.empty(states, dtype=np.uint64)
    for s in range(states):
        hashes[s] = np.uint64(1) if accepting[s] else np.uint64(0)
    count = _labels(hashes, classes, slots, taken)  # accepting or not
    for _ in range(states + 1):  # each round that goes on splits a class: at most `states`
        for s in range(states):
            h = np.uint64(classes[s]) * weights[columns]
            for c in range(columns):
                n = table[s, c]
                if n >= 0:
                    h += np.uint64(classes[n] + 1) * weights[c]
            hashes[s] = h
        grown = _labels(hashes, classes, slots, taken)
        if grown == count:
            break
        count = grown
    return classes, count


@nb.njit(cache=True, nogil=True)
def _labels(hashes, classes, slots, taken):
    """Number the distinct `hashes` in the order they first appear, into `classes`
    (`slots`, `taken`: a hash table's scratch, a power of two over twice the states);
    returns how many there are."""
    mask = np.uint64(slots.size - 1)
    taken[:] = -1
    count = 0
    for s in range(hashes.size):
        h = hashes[s]
        i = h & mask
        while taken[i] >= 0 and slots[i] != h:
            i = (i + np.uint64(1)) & mask
        if taken[i] < 0:
            slots[i] = h
            taken[i] = count
            count += 1
        classes[s] = taken[i]
    return count


@nb.njit(cache=True, nogil=True)
def _quotient(table, accepting, classes, count):
    """(the table over classes, their acceptance, whether `classes` is a congruence: every
    state of a class agrees with the class's first state on acceptance and on the class
    each column leads to)."""
    states, columns = table.shape
    quotient = np.full((count, columns), -1, dtype=np.int32)
    final = np.zeros(count, dtype=np.bool_)
    filled = np.zeros(count, dtype=np.bool_)
    for s in range(states):
        k = classes[s]
        if not filled[k]:
            filled[k] = True
            final[k] = accepting[s]
            for c in range(columns):
                n = table[s, c]
                quotient[k, c] = -1 if n < 0 else classes[n]
            continue
        if final[k] != accepting[s]:
            return quotient, final, False
        for c in range(columns):
            n = table[s, c]
            if quotient[k, c] != (-1 if n < 0 else classes[n]):
                return quotient, final, False
    return quotient, final, True
