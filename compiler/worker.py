"""Compile in worker processes, with a time limit and a memory limit.

outlines-core builds its DFA in native code that cannot be interrupted: one real schema
(Github_medium o12241 with unbounded whitespace) ran 20 minutes and held 7.6 GB. So each
compile runs in a child process; past the timeout the child is killed (and replaced) and the
caller gets a CompileLimitError, while every other request keeps being served.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import queue
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

from gclm.compiler.constraint import Constraint
from gclm.compiler.tables import CompiledTable
from gclm.compiler.vocabulary import TokenVocabulary
from gclm.errors import CompileLimitError, ConstraintError, GclmError

log = logging.getLogger("gclm.compiler")


@dataclass(frozen=True)
class CompileLimits:
    """Limits for one compile. Validated once, here."""

    timeout_s: float = 10.0
    memory_bytes: int = 4 << 30
    max_states: int = 200_000

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"compile timeout must be > 0 seconds, got {self.timeout_s}")
        if self.memory_bytes < 256 << 20:
            raise ValueError("compile memory limit must be at least 256 MiB")
        if self.max_states < 1:
            raise ValueError("compile state limit must be at least 1")


def _serve(conn: Connection, vocab: TokenVocabulary, limits: CompileLimits) -> None:
    """Worker main loop: receive a Constraint, send back table bytes or an error."""
    try:
        import resource

        # Address space, not resident size: the limit a runaway DFA hits first.
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    except (ImportError, ValueError, OSError):  # not on this platform: the timeout still holds
        pass
    from gclm.compiler.compile import compile_constraint

    _warm_up(vocab)
    conn.send(("ready", None))
    while True:
        try:
            constraint = conn.recv()
        except EOFError:
            return
        try:
            table = compile_constraint(constraint, vocab, max_states=limits.max_states)
            conn.send(("ok", table.to_bytes()))
        except GclmError as e:
            conn.send(("error", _flatten(e)))
        except MemoryError:
            conn.send(("error", _flatten(_memory_error(limits))))
        except Exception as e:  # a bug or an outlines-core failure: report, keep serving
            conn.send(("error", _flatten(CompileLimitError(f"Compilation failed: {e!r}"))))


def _warm_up(vocab: TokenVocabulary) -> None:
    """Build the outlines Vocabulary and load the compiled reader before the first request,
    so that the first request's compile time is its own."""
    from gclm.compiler.compile import compile_constraint

    text = next((b.decode() for b in vocab.token_bytes if b and b.isalnum()), None)
    if text is not None:
        try:
            compile_constraint(Constraint.choice([text]), vocab)
        except GclmError:
            pass


def _flatten(e: GclmError) -> tuple[bool, str, str | None, str | None]:
    # Exceptions with their own __init__ arguments do not survive pickling; send the parts.
    return isinstance(e, CompileLimitError), e.message, e.param, e.code


def _rebuild(limit: bool, message: str, param: str | None, code: str | None) -> GclmError:
    if limit:
        return CompileLimitError(message)
    return ConstraintError(message, param=param, code=code)


def _memory_error(limits: CompileLimits) -> CompileLimitError:
    return CompileLimitError(
        f"Compiling the constraint needed more than the {limits.memory_bytes >> 20} MiB "
        "memory limit. Simplify the schema (fewer optional properties, smaller "
        "maxLength/maxItems), or raise --compile-memory (GCLM_COMPILE_MEMORY, in MiB)."
    )


class _Worker:
    def __init__(self, ctx: mp.context.BaseContext, vocab: TokenVocabulary, limits: CompileLimits):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, vocab, limits), daemon=True)
        self.process.start()
        child.close()
        self.ready = False

    def wait_ready(self, timeout: float) -> None:
        if not self.ready:
            if not self.conn.poll(timeout):
                raise CompileLimitError("The compiler worker did not start in time.")
            self.conn.recv()
            self.ready = True

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.conn.close()


class CompilerPool:
    """A few long-lived compile processes. `compile` is thread-safe and blocking."""

    def __init__(
        self,
        vocab: TokenVocabulary,
        limits: CompileLimits | None = None,
        workers: int = 1,
        start_timeout_s: float = 120.0,
    ):
        if workers < 1:
            raise ValueError("compile workers must be at least 1")
        self.vocab = vocab
        self.limits = limits or CompileLimits()
        self.start_timeout_s = start_timeout_s
        # spawn: forking a process that holds torch threads is not safe.
        self._ctx = mp.get_context("spawn")
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False
        for _ in range(workers):
            self._idle.put(_Worker(self._ctx, vocab, self.limits))

    def compile(self, constraint: Constraint) -> CompiledTable:
        """Compile in a worker. Raises ConstraintError or CompileLimitError."""
        worker = self._idle.get()
        try:
            worker.wait_ready(self.start_timeout_s)
            started = time.monotonic()
            worker.conn.send(constraint)
            if not worker.conn.poll(self.limits.timeout_s):
                self._replace(worker)
                worker = None
                raise CompileLimitError(
                    f"Compiling the constraint took longer than {self.limits.timeout_s:g} s and "
                    "was stopped. Simplify the schema (fewer optional properties, bounded "
                    "strings and arrays, no deep nesting), or raise --compile-timeout."
                )
            try:
                status, payload = worker.conn.recv()
            except (EOFError, OSError):
                # The child died: the memory limit made the native code abort.
                self._replace(worker)
                worker = None
                raise _memory_error(self.limits) from None
            log.debug("compiled in %.3f s", time.monotonic() - started)
            if status == "error":
                raise _rebuild(*payload)
            return CompiledTable.from_bytes(payload)
        finally:
            if worker is not None:
                self._idle.put(worker)

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            if not self._closed:
                self._idle.put(_Worker(self._ctx, self.vocab, self.limits))

    def close(self) -> None:
        with self._lock:
            self._closed = True
        while True:
            try:
                self._idle.get_nowait().kill()
            except queue.Empty:
                return
