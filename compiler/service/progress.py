"""How far a compile in a worker process has got, in shared memory the pool reads.

The Retry-After of a compile running in the background needs to know what is left of it.
Almost all of a large compile is the token walk (compiler/whole/token_walk.py), which goes state
by state over a DFA whose state count is known before it starts: measured, a 43k-state
array of bounded strings spent 1.6 s building the byte DFA, 12.7 s walking and 0.1 s on
the rest; 1,000 tools 4.6 s, 6.0 s and 0.1 s. So the worker publishes its phase, the states
walked and the states there are, and the CPU seconds the compile had used when its walk
began; the walk's own numba loop writes the count. compiler/service/compile_job.py turns that into
an estimate.

Layout: one int64 array per worker, `SLOTS` long, zeroed by the pool before each compile.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

# Phases, in the order a compile goes through them.
PREPARE = 0  # the regex and its byte DFA: outlines-core's native code, no count to read
WALK = 1  # the token walk: `done` of `total` states
FINISH = 2  # distances, pruning, the shortest output, serialising: a small share
# Slots of the array.
PHASE, DONE, TOTAL, WALK_CPU_US = 0, 1, 2, 3
SLOTS = 4


@dataclass(frozen=True)
class Progress:
    """A snapshot of one compile's progress."""

    phase: int = PREPARE
    done: int = 0  # states walked
    total: int = 0  # states the walk can reach at most
    walk_cpu_s: float = 0.0  # CPU seconds the compile had used when its walk began

    @property
    def position(self) -> tuple[int, int]:
        """Orders snapshots of one compile: later phases, then more states walked."""
        return (self.phase, self.done)

    @classmethod
    def read(cls, slots: np.ndarray) -> Progress:
        phase, done, total, walk_us = (int(v) for v in slots[:SLOTS])
        return cls(phase, done, total, walk_us / 1e6)


def new_slots() -> np.ndarray:
    """A private array, for a compile that nobody watches."""
    return np.zeros(SLOTS, dtype=np.int64)


class Reporter:
    """The worker's side: marks the phases of one compile in `slots` (None: no-op)."""

    def __init__(self, slots: np.ndarray | None):
        self.slots = new_slots() if slots is None else slots
        self._cpu0 = time.process_time()

    def walking(self, total: int) -> None:
        """The walk starts over at most `total` states; it counts them in slots[DONE]."""
        s = self.slots
        s[DONE], s[TOTAL] = 0, total
        s[WALK_CPU_US] = int((time.process_time() - self._cpu0) * 1e6)
        s[PHASE] = WALK

    def finishing(self) -> None:
        self.slots[PHASE] = FINISH
