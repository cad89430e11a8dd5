"""Whether a grammar's language holds a given text somewhere inside one of its strings.

A tool call's custom input is followed by the next call's separator; an input whose grammar
can write that separator would make the calls ambiguous to read back, so such an input runs
to the end of the output instead (server/openai/tools/prompt.py). The question is decided
exactly on the grammar's recursive transition network (compiler/grown/pushdown.py's
`build_rtn`), recursion included: the network read in step with the needle's
Knuth-Morris-Pratt automaton, each frame summarised by the needle states it may end in for
each needle state it is entered in (a fixed point, as for any context-free language met
with a regular one).
"""

from __future__ import annotations

import hashlib
import threading

import numpy as np

from gclm.compiler.front.deadline import check
from gclm.compiler.front.grammar.frames import GrammarFrames, grammar_frames
from gclm.compiler.front.grammar.lark_regex import grammar_regex
from gclm.compiler.front.grammar.rx import Rx
from gclm.compiler.grown.pushdown import Rtn, build_rtn
from gclm.errors import ConstraintError

# Answers kept for the grammars asked about last (a tool is sent again with every turn),
# by a digest of the question.
_KEPT = 512
_answers: dict[bytes, bool] = {}
_lock = threading.Lock()


def grammar_holds(definition: str, syntax: str, text: str) -> bool:
    """Whether some string of a grammar (`syntax` "lark", or "regex": our dialect, anchors
    stripped) holds `text`; True where that cannot be told (a regex the NFA builder does
    not read, an automaton past its limit). Raises OutOfTime past a thread's deadline."""
    key = hashlib.sha256("\0".join((syntax, text, definition)).encode()).digest()
    with _lock:
        known = _answers.get(key)
    if known is None:
        known = _holds(definition, syntax, text)
        with _lock:
            _answers[key] = known
            while len(_answers) > _KEPT:
                del _answers[next(iter(_answers))]
    return known


def _holds(definition: str, syntax: str, text: str) -> bool:
    try:
        if syntax == "lark":
            frames = grammar_frames(definition)
            if frames is None:  # no recursion: its one regex is exact
                frames = _one(grammar_regex(definition).regex)
        else:
            frames = _one(definition)
        return holds_text(frames, text.encode())
    except (ValueError, ConstraintError):  # Unsupported and CompileLimitError among them
        return True


def _one(regex: str) -> GrammarFrames:
    return GrammarFrames((Rx(regex, False),), ("start",), (0,))


def holds_text(frames: GrammarFrames, needle: bytes) -> bool:
    """Whether some string of `frames`' language holds `needle` (non-empty).

    Raises as build_rtn does (a grammar with no string, left recursion, past its limit)."""
    rtn = build_rtn(frames, np.ones(256, dtype=bool))
    return _Search(rtn, needle).found()


def _steps(needle: bytes) -> list[dict[int, int]]:
    """The needle's automaton: state j (bytes matched) reads byte b into `steps[j][b]`;
    bytes not in the map go to 0."""
    n = len(needle)
    fail = [0] * (n + 1)
    k = 0
    for i in range(1, n):
        while k and needle[i] != needle[k]:
            k = fail[k]
        if needle[i] == needle[k]:
            k += 1
        fail[i + 1] = k
    steps: list[dict[int, int]] = []
    for j in range(n):
        row: dict[int, int] = {}
        for b in set(needle):
            k = j
            while k and needle[k] != b:
                k = fail[k]
            row[b] = k + 1 if needle[k] == b else 0
        steps.append(row)
    return steps


class _Search:
    def __init__(self, rtn: Rtn, needle: bytes) -> None:
        self.rtn = rtn
        self.n = len(needle)
        self.steps = _steps(needle)
        self.alphabet = sorted(set(needle))
        # (frame, needle state at its start) -> needle states at its end
        self.ends: dict[tuple[int, int], set[int]] = {}

    def _next(self, j: int, lo: int, hi: int) -> set[int]:
        """The needle states after state j reads one byte of [lo, hi]."""
        row = self.steps[j]
        inside = [b for b in self.alphabet if lo <= b <= hi]
        out = {row[b] for b in inside}
        if hi - lo + 1 > len(inside):
            out.add(0)
        return out

    def found(self) -> bool:
        """Frame 0 from needle state 0, each frame's summary grown until none changes."""
        self.ends[(0, 0)] = set()
        changed = True
        while changed:
            asked = len(self.ends)
            changed = False
            for entry in list(self.ends):
                ends = self._walk(*entry)
                if ends is None:
                    return True
                if not ends <= self.ends[entry]:
                    self.ends[entry] |= ends
                    changed = True
            changed = changed or len(self.ends) > asked  # frames newly called
        return False

    def _walk(self, frame: int, j0: int) -> set[int] | None:
        """The needle states frame `frame` may end in from `j0`, by today's summaries of
        the frames it calls (asking for those not yet summarised); None: the needle was
        read whole."""
        rtn = self.rtn
        end = rtn.ends[frame]
        start = (rtn.starts[frame], j0)
        seen = {start}
        todo = [start]
        ends: set[int] = set()
        while todo:
            if len(seen) & 0xFFF == 0:
                check()  # a server thread's deadline
            q, j = todo.pop()
            if q == end:
                ends.add(j)
            nexts = [(t, j) for t in rtn.eps[q]]
            for lo, hi, t in rtn.edges[q]:
                for k in self._next(j, lo, hi):
                    if k == self.n:
                        return None
                    nexts.append((t, k))
            for callee, back in rtn.calls[q]:
                summary = self.ends.get((callee, j))
                if summary is None:
                    self.ends[(callee, j)] = set()
                    continue
                nexts += [(back, k) for k in summary]
            for state in nexts:
                if state not in seen:
                    seen.add(state)
                    todo.append(state)
        return ends
