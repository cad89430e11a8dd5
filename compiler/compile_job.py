"""One compile in the pool: who waits for it, and how long it has left (the Retry-After).

A compile outlives the requests that wait for it. Each request is a `Waiter` with its own
deadline (the compile timeout, queue included); at that deadline it is answered 429
`compiler_busy` with an estimate of when the compile will be over, while the `Job` goes on
in the background until its table or its failure is known, which the table cache then
remembers (`CompilerBusyError.compiling` is the Job's outcome). A retry of the same
constraint joins the Job still running instead of starting another.

The estimate is honest about what is known: a queued compile waits for the compiles ahead
of it, each about as long as the recent ones took; a running one is taken to need about as
much CPU again as it has used so far (never more than its ceiling leaves), at the rate of
CPU it has been getting on this machine.
"""

from __future__ import annotations

import math
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

from gclm.compiler.constraint import Constraint
from gclm.compiler.tables import CompiledTable
from gclm.errors import CompilerBusyError

# No Retry-After below this: a client retrying at once only finds the same answer.
MIN_RETRY_S = 1.0
# The CPU rate assumed for a compile that has not run yet (a share of one core).
_FLOOR_RATE = 0.05


@dataclass(eq=False)
class Waiter:
    """One request's wait for a compile."""

    future: Future[CompiledTable]
    since: float  # when its timeout starts: submission, or the pool's first ready worker


@dataclass(eq=False)
class Job:
    """One constraint's compile, queued or running, and the requests still waiting for it."""

    constraint: Constraint
    key: str
    outcome: Future[CompiledTable] = field(default_factory=Future)
    waiters: list[Waiter] = field(default_factory=list)
    late: bool = False  # a waiter's deadline passed: the compile runs in the background


def settle(future: Future[CompiledTable], outcome: object) -> None:
    """Resolve `future` with a table or an exception, unless a waiter cancelled it."""
    try:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)  # type: ignore[arg-type]
    except InvalidStateError:  # cancelled, or already answered
        pass


def running_estimate(cpu_used: float, wall: float, cpu_ceiling: float) -> float:
    """Seconds until a running compile is over, table or failure.

    About as much CPU again as it has used (at least a little), never more than its ceiling
    leaves, at the CPU rate it has had.
    """
    rate = max(cpu_used / wall, _FLOOR_RATE) if wall > 0 else 1.0
    remaining = min(max(cpu_used, 0.5), max(cpu_ceiling - cpu_used, 0.0))
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
        compiling=job.outcome,
    )
