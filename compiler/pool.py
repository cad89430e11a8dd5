"""Compiles scheduled over worker processes, so that slow schemas do not block the others.

The probe this answers: with one worker, six 55-byte schemas that each ran into the 10 s
timeout were answered at 10, 21, ... 63 s, since time in the queue did not count.

- `workers` processes at normal priority take compiles in arrival order.
- A compile still running after `slow_after_s` is demoted: its process is reniced to the
  lowest CPU priority, stops counting as one of the `workers`, and a warm reserve process
  takes its place at once (a new reserve is started). So slow schemas cannot keep a small
  one waiting for a worker, and get the CPU only when nothing else wants it. A demoted
  process is retired when its compile ends (a process cannot raise its priority back). At
  most `max_slow` compiles are demoted at once; past that a slow compile keeps its slot
  until its timeout.
- The timeout bounds the whole wait: a compile is answered within `timeout_s` of its
  submission, queue included; but not the pool's own start: a compile submitted before
  any worker was ready is timed from when the first one is (a cold start, with numba's
  cache to rebuild, took over 10 s inside vLLM's frontend), and waits at most
  `start_timeout_s` for it. One stopped after less than half that in CPU time (it
  waited in the queue, or a loaded machine starved it) is a CompilerBusyError (429: it may
  well succeed later), not a CompileLimitError.
- At most `queue_size` compiles wait for a worker; one more is a CompilerBusyError at once.

`submit` returns a Future and never blocks; one dispatcher thread does the scheduling.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import socket
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import wait

from gclm.compiler.constraint import Constraint
from gclm.compiler.tables import CompiledTable
from gclm.compiler.vocabulary import TokenVocabulary
from gclm.compiler.worker import (
    CompileLimits,
    WorkerProcess,
    memory_error,
    rebuild_error,
    unexpected_error,
)
from gclm.errors import CompileLimitError, CompilerBusyError

log = logging.getLogger("gclm.compiler")

# A worker that is not warmed up after this long is replaced.
START_TIMEOUT_S = 120.0
# Warm processes kept beside the workers, to take a demoted worker's place at once.
_RESERVE = 1
# After this many workers in a row die before they are ready, the pool stops starting more
# and fails compiles with the reason (a memory limit too low to import the compiler, say).
_MAX_START_FAILURES = 3


def _context() -> mp.context.BaseContext:
    """Where workers come from: forked from a warm fork server, or spawned.

    Never forked from the server itself: forking a process that holds torch threads is not
    safe. The fork server is a fresh interpreter that imports only gclm.compiler.warm, so a
    worker starts in a fraction of a second instead of seconds.
    """
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["gclm.compiler.warm"])
    return ctx


def default_workers() -> int:
    """Normal-priority compile processes for this machine: half the cores, 2 to 8.

    The model's forward pass wants the other half; slow compiles run beyond this number,
    demoted, and do not take CPU from either while anything else is runnable.
    """
    return max(2, min(8, (os.cpu_count() or 2) // 2))


@dataclass(eq=False)
class _Job:
    constraint: Constraint
    future: Future[CompiledTable]
    submitted: float  # when its timeout starts: submission, or the pool's first ready worker
    claimed: bool = False  # the future is RUNNING: no waiter can cancel it any more

    def claim(self) -> bool:
        """Mark the future running; False if every waiter cancelled it."""
        if not self.claimed:
            self.claimed = self.future.set_running_or_notify_cancel()
            return self.claimed
        return True


@dataclass(eq=False)
class _Proc:
    worker: WorkerProcess
    job: _Job | None = None
    started: float = 0.0  # when the current job was sent
    demoted: bool = False
    reserve: bool = True  # warm, waiting to replace a demoted worker; takes no jobs
    cpu_at_start: float = 0.0  # the process's CPU seconds when the current job was sent


@dataclass
class PoolStats:
    compiles: int = 0  # answered by a worker, table or error
    timeouts: int = 0  # stopped at the timeout
    busy: int = 0  # refused: queue full, or the timeout spent waiting
    demotions: int = 0
    worker_deaths: int = 0  # the memory limit, or a crash


class CompilerPool:
    """Compile processes with a bounded queue. `submit` and `compile` are thread-safe.

    Args:
        vocab: the tokenizer's vocabulary, sent to each worker once.
        limits: time, memory and state limits of one compile.
        workers: normal-priority processes (None: `default_workers()`).
        queue_size: compiles that may wait for a worker.
        slow_after_s: a compile running this long is demoted (None: a tenth of the timeout,
            at least 0.5 s).
        max_slow: demoted compiles at once (None: 4 x workers).
    """

    def __init__(
        self,
        vocab: TokenVocabulary,
        limits: CompileLimits | None = None,
        *,
        workers: int | None = None,
        queue_size: int = 64,
        slow_after_s: float | None = None,
        max_slow: int | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ):
        self.vocab = vocab
        self.limits = limits or CompileLimits()
        self.workers = default_workers() if workers is None else workers
        self.queue_size = queue_size
        self.slow_after_s = (
            max(0.5, self.limits.timeout_s / 10) if slow_after_s is None else slow_after_s
        )
        self.max_slow = 4 * self.workers if max_slow is None else max_slow
        self.start_timeout_s = start_timeout_s
        if self.workers < 1:
            raise ValueError(f"compile workers must be at least 1, got {self.workers}")
        if queue_size < 0:
            raise ValueError(f"the compile queue size must be 0 or more, got {queue_size}")
        if self.max_slow < 0 or not self.slow_after_s > 0:
            raise ValueError("max_slow must be >= 0 and slow_after_s > 0")
        self.stats = PoolStats()
        self._ctx = _context()
        self._lock = threading.Lock()
        self._jobs: deque[_Job] = deque()
        self._procs: list[_Proc] = []
        self._closed = False
        self._start_failures = 0
        self._broken: str | None = None
        self._ready = threading.Event()
        self._serving = False  # a worker has been ready: compiles are timed from submission
        self._spawning = 0
        self._spawner = ThreadPoolExecutor(4, thread_name_prefix="gclm-compile-spawn")
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        with self._lock:
            self._top_up()
        self._thread = threading.Thread(target=self._run, name="gclm-compile-pool", daemon=True)
        self._thread.start()

    # --- the caller's side ---

    def submit(self, constraint: Constraint) -> Future[CompiledTable]:
        """A future of the compiled table; its exception is a ConstraintError,
        CompileLimitError or CompilerBusyError. Never blocks."""
        future: Future[CompiledTable] = Future()
        with self._lock:
            if self._closed or self._broken:
                future.set_exception(
                    CompileLimitError(self._broken or "The compiler pool is shut down.")
                )
                return future
            if len(self._jobs) >= self.queue_size:
                self.stats.busy += 1
                future.set_exception(
                    CompilerBusyError(
                        f"{len(self._jobs)} constraints are already waiting to be compiled, "
                        "the most this server queues. Retry in a few seconds, or start the "
                        "server with a larger --compile-queue or --compile-workers.",
                        retry_after=self.slow_after_s,
                    )
                )
                return future
            self._jobs.append(_Job(constraint, future, time.monotonic()))
        self._wake()
        return future

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the first processes (the workers and the reserve) are warm (True),
        or `timeout`.

        Time a compile spends queued counts against its timeout, so a server waits for
        this before it serves; else its first compiles would pay for the workers' start.
        """
        return self._ready.wait(timeout)

    def compile(self, constraint: Constraint) -> CompiledTable:
        """Compile and wait. Raises what `submit`'s future would."""
        return self.submit(constraint).result()

    def gauges(self) -> dict[str, int]:
        """Queued and running compiles and live processes, for /metrics."""
        with self._lock:
            running = [p for p in self._procs if p.job is not None]
            return {
                "compile_queue_depth": len(self._jobs),
                "compiles_running": len(running),
                "compiles_demoted": sum(p.demoted for p in running),
                "compile_processes": len(self._procs),
                "compile_workers_idle": sum(
                    p.job is None and p.worker.ready and not p.demoted and not p.reserve
                    for p in self._procs
                ),
            }

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake()
        self._thread.join(10)
        self._spawner.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            jobs, self._jobs = list(self._jobs), deque()
            procs, self._procs = self._procs, []
        for proc in procs:
            if proc.job is not None:
                jobs.append(proc.job)
            proc.worker.kill()
        for job in jobs:
            if job.claim():
                job.future.set_exception(CompileLimitError("The compiler pool is shut down."))
        self._wake_r.close()
        self._wake_w.close()

    # --- the dispatcher thread ---

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:  # closed, or the buffer is full: the dispatcher is awake anyway
            pass

    def _run(self) -> None:
        # The dispatcher enforces every deadline: it must outlive any bug in one round.
        while not self._closed:
            try:
                self._round()
            except Exception:
                log.exception("compile pool dispatcher error; continuing")
                time.sleep(0.1)

    def _round(self) -> None:
        """One dispatch: expire, demote, top up, assign; then wait for a message."""
        done: list[tuple[Future[CompiledTable], object]] = []
        with self._lock:
            if self._closed:
                return
            now = time.monotonic()
            self._expire(now, done)
            self._demote(now)
            self._top_up()
            self._assign(now, done)
            conns = {p.worker.conn: p for p in self._procs}
            timeout = self._next_event(now)
        self._resolve(done)
        ready = wait([*conns, self._wake_r], timeout)
        for conn in ready:
            if conn is self._wake_r:
                self._drain_wake()
                continue
            with self._lock:
                proc = conns[conn]
                if proc in self._procs:
                    self._on_message(proc, done)
        self._resolve(done)

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    @staticmethod
    def _resolve(done: list[tuple[Future[CompiledTable], object]]) -> None:
        # Outside the lock: a future's callbacks may submit again.
        for future, outcome in done:
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)  # type: ignore[arg-type]
        done.clear()

    def _expire(self, now: float, done: list) -> None:
        timeout = self.limits.timeout_s
        if self._broken:
            while self._jobs:
                job = self._jobs.popleft()
                if job.claim():
                    done.append((job.future, CompileLimitError(self._broken)))
        if not self._serving:  # the pool is starting: its start is not the compiles' time
            while self._jobs and now - self._jobs[0].submitted > self.start_timeout_s:
                job = self._jobs.popleft()
                if job.claim():
                    self.stats.busy += 1
                    done.append((job.future, self._not_started(now - job.submitted)))
            return
        while self._jobs and now - self._jobs[0].submitted >= timeout:
            job = self._jobs.popleft()
            if job.claim():
                self.stats.busy += 1
                done.append((job.future, self._busy(now - job.submitted)))
        for proc in list(self._procs):
            job = proc.job
            if job is not None and now - job.submitted >= timeout:
                # CPU time, not wall time, tells a costly schema from a starved one: on a
                # loaded machine a demoted compile can sit for seconds without running.
                cpu = proc.worker.cpu_seconds()
                ran = now - proc.started if cpu is None else cpu - proc.cpu_at_start
                self._retire(proc)
                waited = proc.started - job.submitted
                if ran >= timeout / 2:
                    self.stats.timeouts += 1
                    queued = f" ({waited:.1f} s of it queued)" if waited >= 0.1 else ""
                    error: Exception = CompileLimitError(
                        f"Compiling the constraint took longer than {timeout:g} s{queued} and "
                        "was stopped. Simplify the schema (fewer optional properties, bounded "
                        "strings and arrays, no deep nesting), or raise --compile-timeout."
                    )
                else:
                    self.stats.busy += 1
                    error = self._busy(waited)
                done.append((job.future, error))
            elif (
                job is None
                and not proc.worker.ready
                and now - proc.worker.started > self.start_timeout_s
            ):
                log.error(
                    "a compile worker did not start in %.0f s; replacing it",
                    now - proc.worker.started,
                )
                self._retire(proc)

    def _not_started(self, waited: float) -> CompilerBusyError:
        return CompilerBusyError(
            f"The compiler is starting: no compile worker became ready in {waited:.3g} s. "
            "Retry; if this persists, see the server log (a loaded machine or a low "
            "--compile-memory).",
            retry_after=self.slow_after_s,
        )

    def _busy(self, waited: float) -> CompilerBusyError:
        return CompilerBusyError(
            f"The compiler is busy: the constraint waited {waited:.3g} s for a free compile "
            "worker and got too little CPU time within the compile timeout "
            f"({self.limits.timeout_s:g} s, which covers the wait). Retry; if this persists, "
            "start the server with more --compile-workers.",
            retry_after=self.slow_after_s,
        )

    def _demote(self, now: float) -> None:
        demoted = sum(p.demoted for p in self._procs)
        for proc in self._procs:
            if demoted >= self.max_slow:
                return
            if (
                proc.job is not None
                and not proc.demoted
                and now - proc.started >= self.slow_after_s
            ):
                proc.demoted = True
                proc.worker.lower_priority()
                self.stats.demotions += 1
                demoted += 1

    def _top_up(self) -> None:
        """Keep `workers` processes taking compiles at normal priority, and one warm reserve.

        A demoted worker's place goes to the reserve at once (a new process takes a second
        or more to start on a busy machine), and a new reserve is started. Starting one
        blocks until the child has read the pickled vocabulary, so it happens on the
        spawner threads, not here.
        """
        if self._closed or self._broken:
            return
        fast = [p for p in self._procs if not p.demoted and not p.reserve]
        reserves = sorted((p for p in self._procs if p.reserve), key=lambda p: not p.worker.ready)
        while len(fast) < self.workers and reserves:
            promoted = reserves.pop(0)
            promoted.reserve = False
            fast.append(promoted)
        for proc in fast:  # a ready reserve swaps with an idle worker still starting
            if reserves and reserves[0].worker.ready and not proc.worker.ready:
                swapped = reserves.pop(0)
                swapped.reserve, proc.reserve = False, True
                reserves.append(proc)
        room = self.workers + self.max_slow + _RESERVE - len(self._procs) - self._spawning
        wanted = self.workers - len(fast) + _RESERVE - len(reserves) - self._spawning
        for _ in range(max(0, min(wanted, room))):
            self._spawning += 1
            self._spawner.submit(self._spawn)

    def _spawn(self) -> None:
        try:
            proc = _Proc(WorkerProcess(self._ctx, self.vocab, self.limits))
        except Exception:  # out of processes or memory: the next top-up tries again
            log.exception("could not start a compile worker")
            with self._lock:
                self._spawning -= 1
            return
        with self._lock:
            self._spawning -= 1
            if self._closed:
                proc.worker.kill()
                return
            self._procs.append(proc)
        self._wake()

    def _assign(self, now: float, done: list) -> None:
        idle = [
            p
            for p in self._procs
            if p.job is None and p.worker.ready and not p.demoted and not p.reserve
        ]
        while idle and self._jobs:
            job = self._jobs.popleft()
            if not job.claim():
                continue  # every waiter left
            proc = idle.pop(0)
            try:
                proc.worker.conn.send(job.constraint)
            except OSError:  # the process died while idle: requeue the job
                self._retire(proc)
                self._jobs.appendleft(job)
                continue
            proc.job, proc.started = job, now
            proc.cpu_at_start = proc.worker.cpu_seconds() or 0.0

    def _on_message(self, proc: _Proc, done: list) -> None:
        try:
            kind, payload = proc.worker.conn.recv()
        except (EOFError, OSError):
            self.stats.worker_deaths += 1
            job = proc.job
            self._retire(proc)
            if job is not None:
                done.append((job.future, memory_error(self.limits)))
            elif not proc.worker.ready:
                self._start_failed()
            return
        if kind == "ready":
            proc.worker.ready = True
            self._start_failures = 0
            if not self._serving:
                self._serving = True
                now = time.monotonic()
                for queued in self._jobs:  # their timeouts start now
                    queued.submitted = now
            if sum(p.worker.ready for p in self._procs) >= self.workers + _RESERVE:
                self._ready.set()
            return
        job, proc.job = proc.job, None
        if job is None:
            return
        self.stats.compiles += 1
        if kind == "ok":
            try:
                done.append((job.future, CompiledTable.from_bytes(payload)))
            except (ValueError, KeyError) as e:  # not reachable unless the worker is broken
                log.error("a compile worker sent a malformed reply: %r", e)
                done.append((job.future, unexpected_error()))
        else:
            done.append((job.future, rebuild_error(*payload)))
        if proc.demoted:
            self._retire(proc)

    def _start_failed(self) -> None:
        self._start_failures += 1
        if self._start_failures >= _MAX_START_FAILURES:
            self._broken = (
                f"The compile workers exited {self._start_failures} times before they were "
                "ready; see the server log. A --compile-memory too low to load the compiler "
                "does this."
            )
            log.error("%s", self._broken)
            self._ready.set()  # nothing more to wait for

    def _retire(self, proc: _Proc) -> None:
        self._procs.remove(proc)
        # A process that held gigabytes takes a while to exit: reap it off this thread.
        proc.worker.process.kill()
        proc.worker.conn.close()
        threading.Thread(target=proc.worker.process.join, args=(30,), daemon=True).start()

    def _next_event(self, now: float) -> float:
        """Seconds until a deadline or a demotion is due (at most 1 s)."""
        due = [now + 1.0]
        if self._jobs:
            wait = self.limits.timeout_s if self._serving else self.start_timeout_s
            due.append(self._jobs[0].submitted + wait)
        for proc in self._procs:
            if proc.job is not None:
                due.append(proc.job.submitted + self.limits.timeout_s)
                if not proc.demoted:
                    due.append(proc.started + self.slow_after_s)
        return max(0.0, min(due) - now)
