"""One compile in the pool: who waits for it, and how long it has left (the Retry-After).

A compile outlives the requests that wait for it. Each request is a `Waiter` with its own
deadline (the compile timeout, queue included); at that deadline it is answered 429
`compiler_busy` with an estimate of when the compile will be over, while the `Job` goes on
in the background until its table or its failure is known, which the table cache then
remembers: a request's answer is a `Compiling`, whose `outcome` is the Job's. A retry of the
same constraint joins the Job still running instead of starting another.

The estimate is honest about what is known: a queued compile waits for the compiles ahead
of it, each about as long as the recent ones took. A running one reports its progress
(compiler/service/progress.py). Almost all of a large compile is its token walk, state by state
over a DFA whose state count is known once the byte DFA is built: the CPU still needed is
the walk's CPU so far times the states left over the states walked, blended, early in the
walk, with a guess per state (`remaining_cpu`), plus a little for what follows; before the
walk, a guess from the DFA's CPU.
That CPU, never more than the ceiling leaves, is turned into seconds at the rate of CPU the
compile has been getting on this machine. For one compile, the end a 429 announces never
moves earlier unless the compile reported progress since the last one.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import CancelledError, Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.service.progress import PREPARE, WALK, Progress
from gclm.compiler.whole.tables import CompiledTable
from gclm.errors import CompilerBusyError

# No Retry-After below this: a client retrying at once only finds the same answer.
MIN_RETRY_S = 1.0
# The CPU rate assumed for a compile that has not run yet (a share of one core).
_FLOOR_RATE = 0.05
# What follows the token walk, as a share of the walk's CPU: measured about 1% (distances,
# pruning, serialising; a 43k-state table 0.11 s after a 12.7 s walk); room for the rest.
_AFTER_WALK = 0.1
# The token walk's CPU over the byte DFA's, assumed while the DFA is built: measured 1.3
# (1,000 tools), 4.9 (six 400-character fields), 8 (a 43k-state array). The largest: a
# retry sent too early is another 429, one sent late only waits.
_WALK_PER_DFA = 8.0
# CPU seconds the walk takes per state, assumed until its own rate is known: measured 290
# and 350 us for string-heavy schemas, 68 us for 1,000 tools (few tokens fit a name).
_CPU_PER_STATE = 300e-6
T = TypeVar("T")

# A position before any running one: queued compiles (the queue's head counts as later).
QUEUED = -1


class Compiling(Future[T], Generic[T]):
    """A request's answer from a compile: its table, the compile's error, or a
    CompilerBusyError at the request's deadline while the compile goes on.

    `outcome` is the compile's own end, table or error, resolved whoever still waits (the
    table cache keeps a table that lands after its requests were answered 429, and a
    request served on first masks is charged the compile it stood in for). Where nothing
    goes on (a hit, a refusal), it ends with the answer.
    """

    def __init__(self) -> None:
        super().__init__()
        self.outcome: Future[T] = Future()

    @classmethod
    def ended(cls, outcome: object) -> Compiling[Any]:
        """An answer and an outcome both already `outcome` (a value or an exception)."""
        answer: Compiling[Any] = cls()
        answer.end(outcome)
        return answer

    def end(self, outcome: object) -> None:
        """Answer with `outcome` and end the compile with it (unless either is answered)."""
        settle(self, outcome)
        settle(self.outcome, outcome)

    def follow(self, source: Future[Any]) -> None:
        """End `outcome` as `source` (a compile's outcome) ends."""
        source.add_done_callback(lambda done: settle(self.outcome, _outcome_of(done)))


def _outcome_of(future: Future[Any]) -> object:
    """A done future's result, or its exception (a cancelled one's CancelledError)."""
    if future.cancelled():
        return CancelledError()
    error = future.exception()
    return error if error is not None else future.result()


@dataclass(eq=False)
class Waiter:
    """One request's wait for a compile."""

    future: Compiling[Any]
    since: float  # when its timeout starts: submission, or the pool's first ready worker


@dataclass(eq=False)
class Job:
    """One constraint's compile, queued or running, and the requests still waiting for it."""

    constraint: Constraint
    key: str
    mode: str = "table"  # what the worker is asked for: compiler/service/worker.py's TABLE, FIRST
    outcome: Future[CompiledTable] = field(default_factory=Future)
    # The byte DFA (next, accepting), sent before the token walk; None when the worker sent
    # none (too large) or the compile ended without it.
    dfa: Future[tuple[np.ndarray, np.ndarray] | None] = field(default_factory=Future)
    waiters: list[Waiter] = field(default_factory=list)
    # When it was queued, or when the pool's first worker was ready (its start is no wait)
    queued_at: float = field(default_factory=time.monotonic)
    late: bool = False  # a waiter's deadline passed: the compile runs in the background
    eta: float = 0.0  # when the last 429 said the compile would be over (monotonic clock)
    eta_position: tuple[int, int] = (QUEUED, -(1 << 62))  # the progress it was based on

    def retry_after(self, now: float, estimate: float, position: tuple[int, int]) -> float:
        """Seconds to tell a client, from `estimate` at progress `position`: the end
        announced before stands unless the compile has progressed since, so a client
        retrying later is never told a sooner end on a guess alone."""
        end = now + estimate
        if end < self.eta and position <= self.eta_position:
            end = self.eta
        self.eta, self.eta_position = end, max(position, self.eta_position)
        return max(MIN_RETRY_S, end - now)


def abandoned_error() -> CompilerBusyError:
    """A compile stopped because every request that asked for it left (not remembered)."""
    return CompilerBusyError(
        "The constraint's compile was stopped: every request that asked for it left "
        "before it ended. Send the request again to compile it.",
        retry_after=MIN_RETRY_S,
    )


def settle(future: Future[Any], outcome: object) -> None:
    """Resolve `future` with a table (or a DFA) or an exception, unless a waiter cancelled
    it."""
    try:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
    except InvalidStateError:  # cancelled, or already answered
        pass


def remaining_cpu(cpu_used: float, progress: Progress) -> float:
    """CPU seconds a running compile still needs, from the progress it reports.

    In the byte DFA nothing is counted: its walk is guessed from the DFA's CPU so far
    (`_WALK_PER_DFA`). In the walk, a guess of `_CPU_PER_STATE` for each state left gives
    way to the walk's own rate as the walk goes, weighted by the square root of the share
    walked (the first states cost the most: 2% of the way in, a straight extrapolation was
    three to eight times too long).
    """
    if progress.phase == PREPARE:
        return max(_WALK_PER_DFA * cpu_used, 0.5)
    walk = max(cpu_used - progress.walk_cpu_s, 1e-3)
    if progress.phase == WALK and progress.done < progress.total:
        left_states = progress.total - progress.done
        share = progress.done / progress.total
        guess = _CPU_PER_STATE * left_states
        measured = walk * left_states / max(progress.done, 1)
        weight = math.sqrt(share)
        left = (1 - weight) * guess + weight * measured
        return max(left + _AFTER_WALK * (walk + left), 0.2)
    return max(_AFTER_WALK * walk, 0.2)


def running_estimate(
    cpu_used: float, wall: float, cpu_ceiling: float, progress: Progress | None = None
) -> float:
    """Seconds until a running compile is over, table or failure.

    The CPU it still needs (`remaining_cpu`), never more than its ceiling leaves, at the
    CPU rate it has had.
    """
    rate = max(cpu_used / wall, _FLOOR_RATE) if wall > 0 else 1.0
    needed = remaining_cpu(cpu_used, progress or Progress())
    remaining = min(needed, max(cpu_ceiling - cpu_used, 0.0))
    return max(MIN_RETRY_S, remaining / rate)


def queued_estimate(position: int, workers: int, typical_s: float) -> float:
    """Seconds until a compile `position` places from the queue's head is over: the rounds
    of `workers` compiles ahead of it, then its own, each `typical_s` long."""
    return max(MIN_RETRY_S, (position // max(1, workers) + 1) * typical_s)


def late_error(job: Job, waited: float, retry_after: float, running: bool) -> CompilerBusyError:
    """The 429 for a request whose compile is still queued or running at its deadline."""
    where = "is still compiling" if running else "is still waiting for a compile worker"
    return CompilerBusyError(
        f"The compiler is busy: after {waited:.3g} s the constraint {where}. It goes on in "
        "the background and its table (or its failure) will be remembered; retry in "
        f"{math.ceil(retry_after)} s. If this persists, start the server with more "
        "--compile-workers.",
        retry_after=retry_after,
    )


def copy_outcome(source: Future[Any], target: Future[Any]) -> None:
    """`source`'s result or exception, into `target` (unless it is answered already)."""
    try:
        target.set_result(source.result())
    except InvalidStateError:
        pass
    except BaseException as e:
        settle(target, e)
