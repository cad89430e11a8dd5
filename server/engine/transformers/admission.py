"""The admission queue: sequences waiting for a KV slot, bounded by the slots' capacity.

A submitted sequence waits here until the engine thread gives it a slot (`take`). It is
refused (429 `queue_full`) only when the queue is really full: more sequences wait than
the free slots take plus `queue_size` more, so a burst never gets a 429 while a slot is
free for it (the engine thread admits only between forward passes, so a burst can arrive
all at once). The 429's Retry-After is the queue's own estimate of when a place opens:
the full batches ahead of the request times how long a sequence holds its slot (a moving
average of the sequences finished).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque

from gclm.errors import QueueFullError
from gclm.server.engine.transformers.sequence import Sequence

# Retry-After bounds, in seconds: at least the header's unit, at most a minute (past that
# the estimate says more about the average than about this queue).
MIN_RETRY_S = 1.0
MAX_RETRY_S = 60.0
# Weight of the latest finished sequence in the moving average of slot hold times.
SERVICE_WEIGHT = 0.1


class AdmissionQueue:
    """Sequences waiting for one of `slots` KV slots; `cond` guards it and wakes the engine.

    `free` is set by the engine thread after each pass: the slots no sequence holds or has
    been promised. Everything else is called from either thread under `cond`.
    """

    def __init__(self, slots: int, queue_size: int) -> None:
        if queue_size < 1:
            raise ValueError(f"queue_size must be at least 1, got {queue_size}.")
        self.cond = threading.Condition()
        self.slots = slots
        self.queue_size = queue_size
        self.free = slots
        self._waiting: deque[Sequence] = deque()
        self._hold_s: float | None = None  # moving average: admission to finish
        self.counts = {"admitted": 0, "queue_wait_seconds": 0.0, "queue_full_rejections": 0}

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, seq: object) -> bool:
        return seq in self._waiting

    def put(self, seq: Sequence) -> None:
        """Queue `seq`, or raise QueueFullError (with its Retry-After) when full."""
        with self.cond:
            if len(self._waiting) >= self.free + self.queue_size:
                self.counts["queue_full_rejections"] += 1
                raise QueueFullError(len(self._waiting), retry_after=self.retry_after())
            seq.queued_at = time.monotonic()
            self._waiting.append(seq)
            self.cond.notify()

    def retry_after(self) -> float:
        """Seconds until a request queued now would get a slot: the whole batches ahead of
        it times a sequence's average hold on its slot (1 s before any has finished)."""
        ahead = max(0, len(self._waiting) - self.free) + 1
        hold = self._hold_s if self._hold_s is not None else 1.0
        estimate = math.ceil(ahead / self.slots) * hold
        return float(min(MAX_RETRY_S, max(MIN_RETRY_S, math.ceil(estimate))))

    def remove(self, seq: Sequence) -> None:
        with self.cond:
            if seq in self._waiting:
                self._waiting.remove(seq)

    def drain(self) -> list[Sequence]:
        """Every waiting sequence, the queue left empty (the engine died)."""
        with self.cond:
            taken = list(self._waiting)
            self._waiting.clear()
        return taken

    def take(self, room: int) -> list[Sequence]:
        """Up to `room` waiting sequences, oldest first, cancelled ones dropped."""
        now = time.monotonic()
        taken: list[Sequence] = []
        with self.cond:
            while room > len(taken) and self._waiting:
                seq = self._waiting.popleft()
                if seq.cancelled:
                    continue
                seq.admitted_at = now
                self.counts["queue_wait_seconds"] += now - seq.queued_at
                taken.append(seq)
            self.counts["admitted"] += len(taken)
        return taken

    def oldest_wait(self) -> float:
        """Seconds the first waiting sequence has waited (0 when none waits)."""
        with self.cond:
            return time.monotonic() - self._waiting[0].queued_at if self._waiting else 0.0

    def finished(self, seq: Sequence) -> None:
        """Fold how long `seq` held its slot into the average the Retry-After uses."""
        if seq.admitted_at:
            held = time.monotonic() - seq.admitted_at
            last = self._hold_s
            self._hold_s = held if last is None else last + SERVICE_WEIGHT * (held - last)
