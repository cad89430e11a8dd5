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

import numpy as np

from bench.lazy_dfa import MAX_CODEPOINT, Unsupported, _class_ranges, utf8_sequences
from gclm.compiler.grown.regex_nfa import nfa_distances, write_nfa
from gclm.compiler.grown.regex_parse import ALT, REP, SEQ, SET, UNBOUNDED


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


def compiled_nfa(program: Any, root: int) -> tuple[int, int, np.ndarray]:
    """Write the program out (numba): (states, accepting state, bytes to accept per state).
    `program`: a Program, or compiler/grown/regex_parse.ParsedRegex (the same arrays)."""
    n, accept, (eps_src, eps_dst, e_src, _, _, e_dst) = write_nfa(program, root, share=False)
    return n, accept, nfa_distances(n, accept, eps_src, eps_dst, e_src, e_dst)


def as_python_nfa(program: Any, root: int) -> tuple[Any, int]:
    """The written-out NFA as bench.lazy_dfa.Nfa (for its LazyDfa) and its accepting state."""
    from bench.lazy_dfa import Nfa

    n, accept, (eps_src, eps_dst, e_src, e_lo, e_hi, e_dst) = write_nfa(program, root, share=False)
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
