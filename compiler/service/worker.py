"""One compile worker process, with a memory limit; compiler/service/pool.py schedules many.

outlines-core builds its DFA in native code that cannot be interrupted: one real schema
(Github_medium o12241 with unbounded whitespace) ran 20 minutes and held 7.6 GB. So each
compile runs in a child process; past the timeout the pool kills the child (and starts
another) and the caller gets a CompileLimitError, while every other request keeps being
served.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.service.progress import SLOTS
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.errors import CompileLimitError, ConstraintError, GclmError

if TYPE_CHECKING:
    from gclm.compiler.whole.byte_dfa import ByteDfa

log = logging.getLogger("gclm.compiler")

# A byte DFA of at most this many states (1 KiB each) is sent to the pool before the token
# walk, so that the first request can start on masks walked state by state
# (compiler/grown/lazy_table.py) while the whole table is compiled.
EARLY_DFA_MAX_STATES = 16_384
_PR_SET_PDEATHSIG = 1  # linux/prctl.h

# What a worker is asked to compile (the second item of what it receives):
TABLE = "table"  # the whole table
TABLE_AND_DFA = "table+dfa"  # the whole table, its byte DFA sent ahead as ("dfa", ...)
# The byte DFA alone, compact (a SentDfa), when a LazyTable can serve it
# (compiler/service/first_mask.py) and it is within the state limit; else the whole table, as for
# TABLE.
FIRST = "first"

try:
    _CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
    _PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
except (AttributeError, ValueError, OSError):
    _CLOCK_TICKS, _PAGE_BYTES = 100, 4096


class SentDfa(NamedTuple):
    """What a FIRST compile sends when a LazyTable can serve the constraint."""

    next: np.ndarray  # int32 [S, K]: compiler/whole/byte_dfa.py's ByteDfa, compact
    accepting: np.ndarray  # bool [S]
    classes: np.ndarray  # uint8 [256]: each byte's column of `next`
    seconds: float  # the compile's wall time in the worker


@dataclass(frozen=True)
class CompileLimits:
    """Limits for one compile. Validated once, here."""

    timeout_s: float = 10.0  # how long a request waits for its compile, queue included
    memory_bytes: int = 4 << 30
    max_states: int = 200_000
    # CPU seconds one compile may use, in the background past its request's timeout too.
    # Well above ordinary constraints: `json_object` alone took 12.7 s of CPU on a loaded
    # 2-core machine (a CPU second there does less than on an idle one).
    cpu_s: float = 60.0

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"compile timeout must be > 0 seconds, got {self.timeout_s}")
        if not self.cpu_s > 0:
            raise ValueError(f"compile CPU limit must be > 0 seconds, got {self.cpu_s}")
        if self.memory_bytes < 256 << 20:
            raise ValueError("compile memory limit must be at least 256 MiB")
        if self.max_states < 1:
            raise ValueError("compile state limit must be at least 1")


def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent (the fork server, which exits with the
    server) dies: a compile busy in compiled code reads no pipe, and was left running,
    re-parented to init, after a server killed mid-compile."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # no prctl here: the pool's close still kills it
        pass


def _serve(conn: Connection, vocab: TokenVocabulary, limits: CompileLimits, shared: Any) -> None:
    """Worker main loop: receive (Constraint, TABLE | TABLE_AND_DFA | FIRST), send back table
    bytes, a byte DFA or an error; report each compile's progress in `shared`
    (compiler/service/progress.py's slots)."""
    slots = np.frombuffer(shared, dtype=np.int64)
    _die_with_parent()
    try:
        import resource

        # Address space, not resident size: the limit a runaway DFA hits first.
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    except (ImportError, ValueError, OSError):  # not on this platform: the timeout still holds
        pass
    from gclm.compiler.whole.compile import compile_constraint

    _warm_up(vocab)
    conn.send(("ready", None))
    while True:
        try:
            constraint, mode = conn.recv()
        except EOFError:
            return
        early = min(limits.max_states, EARLY_DFA_MAX_STATES)
        try:
            if mode == FIRST:
                _first(conn, constraint, vocab, limits, slots)
                continue
            table = compile_constraint(
                constraint,
                vocab,
                max_states=limits.max_states,
                progress=slots,
                on_dfa=partial(_send_dfa, conn, early) if mode == TABLE_AND_DFA else None,
            )
            conn.send(("ok", table.to_bytes()))
        except GclmError as e:
            conn.send(("error", _flatten(e)))
        except MemoryError:
            conn.send(("error", _flatten(memory_error(limits))))
        except Exception:  # a bug or an outlines-core failure: report, keep serving
            log.exception("compile failed unexpectedly")
            conn.send(("error", _flatten(unexpected_error())))


def _first(
    conn: Connection,
    constraint: Constraint,
    vocab: TokenVocabulary,
    limits: CompileLimits,
    slots: np.ndarray,
) -> None:
    """A FIRST compile: the byte DFA where a LazyTable can serve it, else the whole table."""
    from gclm.compiler.grown.lazy_table import can_serve
    from gclm.compiler.service.progress import Reporter
    from gclm.compiler.whole.compile import build_dfa, table_from_dfa

    started = time.perf_counter()
    report = Reporter(slots)
    built = build_dfa(constraint)
    if built.dfa.next.shape[0] <= limits.max_states:
        dfa = built.dfa.compact()  # a column per class of bytes: a quarter of the size
        if can_serve(dfa, vocab):
            seconds = time.perf_counter() - started
            conn.send(("first", tuple(SentDfa(dfa.next, dfa.accepting, dfa.columns, seconds))))
            return
    table = table_from_dfa(built, vocab, started, report, max_states=limits.max_states)
    conn.send(("ok", table.to_bytes()))


def _send_dfa(conn: Connection, max_states: int, dfa: ByteDfa) -> None:
    """Send the byte DFA ahead of the table, unless it is over `max_states` states: then the
    whole compile may refuse it, and no request may have started on it."""
    if dfa.next.shape[0] <= max_states:
        conn.send(("dfa", (dfa.next, dfa.accepting)))


def _warm_up(vocab: TokenVocabulary) -> None:
    """Build the outlines Vocabulary and load the compiled reader and a FIRST compile's
    bounds before the first request, so that the first request's compile time is its own."""
    from gclm.compiler.grown.lazy_table import can_serve
    from gclm.compiler.whole.compile import build_dfa, compile_constraint

    text = next((b.decode() for b in vocab.token_bytes if b and b.isalnum()), None)
    if text is not None:
        try:
            compile_constraint(Constraint.choice([text]), vocab)
            can_serve(build_dfa(Constraint.choice([text])).dfa, vocab)
        except GclmError:
            pass


def _flatten(e: GclmError) -> tuple[bool, str, str | None, str | None]:
    # Exceptions with their own __init__ arguments do not survive pickling; send the parts.
    return isinstance(e, CompileLimitError), e.message, e.param, e.code


def rebuild_error(limit: bool, message: str, param: str | None, code: str | None) -> GclmError:
    """The error a worker sent as `("error", parts)`."""
    if limit:
        return CompileLimitError(message)
    return ConstraintError(message, param=param, code=code)


def unexpected_error() -> ConstraintError:
    """What a client is told of a compile that failed in a way gclm did not foresee (the
    details go to the server's log, never to the client)."""
    return ConstraintError(
        "gclm could not compile this constraint (an unexpected error in the compiler, "
        "logged on the server). Simplify the constraint, or report it with the constraint.",
        code="compile_failed",
    )


def memory_error(limits: CompileLimits) -> CompileLimitError:
    """The error for a compile whose worker died: the memory limit made native code abort."""
    return CompileLimitError(
        f"Compiling the constraint needed more than the {limits.memory_bytes >> 20} MiB "
        "memory limit. Simplify the schema (fewer optional properties, smaller "
        "maxLength/maxItems), or raise --compile-memory (GCLM_COMPILE_MEMORY, in MiB)."
    )


class WorkerProcess:
    """One compile process and the parent's end of its pipe.

    Protocol: the child sends ("ready", None) once warmed up, then answers each
    (Constraint, mode) it receives with ("ok", table bytes), ("first", byte DFA) or
    ("error", parts), ("dfa", byte DFA) ahead of the table in TABLE_AND_DFA mode, and writes
    how far the current compile has got to `progress` as it goes. Scheduling is
    compiler/service/pool.py's.
    """

    def __init__(
        self,
        ctx: Any,  # a spawn or forkserver context: BaseContext declares no Process
        vocab: TokenVocabulary,
        limits: CompileLimits,
    ):
        self.conn, child = ctx.Pipe()
        shared = ctx.RawArray("q", SLOTS)
        # The pool zeroes it before each compile, the worker writes it as the compile goes.
        self.progress = np.frombuffer(shared, dtype=np.int64)
        self.process = ctx.Process(target=_serve, args=(child, vocab, limits, shared), daemon=True)
        self.process.start()
        child.close()
        self.ready = False
        self.started = time.monotonic()

    def cpu_seconds(self) -> float | None:
        """User + system CPU seconds the process has used (Linux /proc), or None."""
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
        except (OSError, IndexError, ValueError):
            return None

    def resident_bytes(self) -> int:
        """The process's resident memory (0 where /proc cannot say)."""
        try:
            pages = int(Path(f"/proc/{self.process.pid}/statm").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            return 0
        return pages * _PAGE_BYTES

    def lower_priority(self, nice: int = 19) -> bool:
        """Renice the process to `nice` (it cannot be raised back)."""
        try:
            os.setpriority(os.PRIO_PROCESS, self.process.pid, nice)
            return True
        except (AttributeError, OSError):  # not on this platform: it still frees its slot
            return False

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.conn.close()
