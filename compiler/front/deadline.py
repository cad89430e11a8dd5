"""A deadline for compile work that runs in the server's own threads, checked as it goes.

Writing a constraint's regex is Python (JSON Schema normalisation, a grammar's expansion):
a thread cannot be stopped from outside, and some real schemas take minutes there (MaskBench
WashingtonPost wp_124: its `oneOf`s under `$ref`s). Where that work runs in the server, it
runs inside `work_deadline(seconds)`, and its loops call `check()`, which raises OutOfTime
past it: the work is then left to a compile worker, which has its own CPU limit and can be
killed. Outside a `work_deadline`, in the workers and in `gclm compile`, `check()` does
nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_DEADLINE: ContextVar[float | None] = ContextVar("gclm_work_deadline", default=None)


class OutOfTime(Exception):
    """In-process compile work passed its `work_deadline`."""


@contextmanager
def work_deadline(seconds: float) -> Iterator[None]:
    """`check()` raises OutOfTime `seconds` from now, within the block (this thread's)."""
    token = _DEADLINE.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def check() -> None:
    """Raise OutOfTime past the deadline of the enclosing `work_deadline`, if any."""
    deadline = _DEADLINE.get()
    if deadline is not None and time.monotonic() > deadline:
        raise OutOfTime("compile work in the server passed its deadline")
