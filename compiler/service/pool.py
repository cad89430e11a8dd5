"""Compiles scheduled over worker processes, so that slow schemas do not block the others.

The probe this answers: with one worker, six 55-byte schemas that each ran into the 10 s
timeout were answered at 10, 21, ... 63 s, since time in the queue did not count.

- `workers` processes take compiles in arrival order, at the server's own priority: the
  kernel shares the cores fairly between runnable threads, so a compile worker gets about
  what one of the model's threads gets, next to a busy engine.
- A compile still running after `slow_after_s` is demoted: it stops counting as one of
  the `workers`, and a warm reserve process takes its place at once (a new reserve is
  started). So slow schemas cannot keep a small one waiting for a worker. It keeps the
  server's priority (`DEMOTED_NICE`): one runnable process among the machine's, it gets
  what one of the engine's threads gets. A demoted process is retired when its compile
  ends. At most `max_slow` compiles are demoted at once (what they can take from the
  engine is bounded by that and by the CPU ceiling); past that a slow compile keeps its
  slot.
- A request waits at most `timeout_s` for its compile, queue included; but not for the
  pool's own start: a compile submitted before any worker was ready is timed from when the
  first one is (a cold start, with numba's cache to rebuild, took over 10 s inside vLLM's
  frontend), and waits at most `start_timeout_s` for it.
- A compile outlives its requests (compiler/service/compile_job.py): at a request's deadline the
  request gets a CompilerBusyError (429) whose `retry_after` estimates when the compile
  will be over (from the progress the worker reports), while the compile goes on in the
  background to the answer's `outcome` (a `Compiling`), bounded by `limits.cpu_s` of CPU
  time, the memory limit and the state limit. Past any of them it ends with a
  CompileLimitError, which the table cache remembers: every later request for it is a 400
  at once, whatever the machine's load.
  A retry of a constraint still compiling joins that compile. A compile starved of CPU (below
  its ceiling after 20 x the ceiling in wall time, and 10 minutes) is stopped as busy, not
  remembered.
- At most `queue_size` compiles wait for a worker; one more is a CompilerBusyError at once.

`submit` returns a `Compiling` (a Future) and never blocks; one dispatcher thread does the
scheduling.
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
from typing import Any

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.service.compile_job import (
    MIN_RETRY_S,
    QUEUED,
    Compiling,
    Job,
    Waiter,
    abandoned_error,
    late_error,
    queued_estimate,
    running_estimate,
    settle,
)
from gclm.compiler.service.progress import Progress
from gclm.compiler.service.worker import (
    FIRST,
    TABLE,
    TABLE_AND_DFA,
    CompileLimits,
    SentDfa,
    WorkerProcess,
    memory_error,
    rebuild_error,
    unexpected_error,
)
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.tables import CompiledTable
from gclm.errors import CompileLimitError, CompilerBusyError

log = logging.getLogger("gclm.compiler")

# A worker that is not warmed up after this long is replaced.
START_TIMEOUT_S = 120.0
# Warm processes kept beside the workers, to take a demoted worker's place at once.
_RESERVE = 1
# After this many workers in a row die before they are ready, the pool stops starting more
# and fails compiles with the reason (a memory limit too low to import the compiler, say).
_MAX_START_FAILURES = 3
# A demoted compile's niceness: the server's own. At 5 (weight 335 against 1,024) beside
# six busy processes on two cores a compile got 0.037 of a core against 0.119 at 0, 3.5x
# the wall time (bench/compile_share.py, one run side by side): a 43k-state table then
# took minutes and its retries kept getting 429. At 19 it never ended.
DEMOTED_NICE = 0
# A demoted compile that no request waits for any more (each got its 429) goes on at this
# niceness: hostile constraints past the timeout kept up to 4 x --compile-workers
# processes busy at the server's priority for up to --compile-cpu-limit each, and the
# engine's steps and new small constraints waited for the cores behind them. A retry
# that joins it waits longer; the starved rule below still stops one that gets nothing.
UNWAITED_NICE = 10
# A compile still below its CPU ceiling after this many times the ceiling in wall time (and
# at least `_STARVED_MIN_S`) is starved, not costly: stopped as busy, and not remembered.
# Generous: a starved compile costs little, and stopping it throws its work away (on a
# loaded 2-core machine a compile got 0.9 s of CPU in 21 s).
_STARVED_FACTOR = 20
_STARVED_MIN_S = 600.0
# Wall seconds a compile is assumed to take before any has finished (the Retry-After of a
# queued compile); then the recent compiles' average.
_TYPICAL_S = 1.0


def _context() -> mp.context.BaseContext:
    """Where workers come from: forked from a warm fork server, or spawned.

    Never forked from the server itself: forking a process that holds torch threads is not
    safe. The fork server is a fresh interpreter that imports only gclm.compiler.service.warm, so a
    worker starts in a fraction of a second instead of seconds.
    """
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["gclm.compiler.service.warm"])
    return ctx


def _shut_down() -> CompilerBusyError:
    # Not a CompileLimitError: nothing is wrong with the constraint, and the cache must not
    # remember it (on disk it would outlive the restart).
    return CompilerBusyError("The server is shutting down; retry on its next start.", 5.0)


def default_workers() -> int:
    """Normal-priority compile processes for this machine: half the cores, 2 to 8.

    The model's forward pass wants the other half; slow compiles run beyond this number,
    demoted, each with one thread's share.
    """
    return max(2, min(8, (os.cpu_count() or 2) // 2))


@dataclass(eq=False)
class _Proc:
    worker: WorkerProcess
    job: Job | None = None
    started: float = 0.0  # when the current job was sent
    demoted: bool = False
    unwaited: bool = False  # reniced to UNWAITED_NICE: its compile goes on for no request
    reserve: bool = True  # warm, waiting to replace a demoted worker; takes no jobs
    cpu_at_start: float = 0.0  # the process's CPU seconds when the current job was sent

    def cpu_used(self, now: float) -> float:
        """CPU seconds the current job has used (wall time where /proc cannot say)."""
        cpu = self.worker.cpu_seconds()
        return now - self.started if cpu is None else cpu - self.cpu_at_start


@dataclass
class PoolStats:
    compiles: int = 0  # answered by a worker, table or error
    timeouts: int = 0  # stopped at the CPU ceiling
    busy: int = 0  # refused: queue full, or a request's deadline passed
    demotions: int = 0
    worker_deaths: int = 0  # the memory limit, or a crash
    background: int = 0  # compiles that went on after a request's deadline passed
    background_done: int = 0  # ... and ended (table or failure) with nobody waiting
    shed: int = 0  # ... or were stopped, holding too much memory (_shed_unwaited)
    abandoned: int = 0  # stopped because every request that asked for them left
    cpu_seconds: float = 0.0  # CPU time of ended compiles, in the workers
    started: int = 0  # compiles handed to a worker
    first_started: int = 0  # ... of them FIRST compiles (the byte DFA alone, where it serves)
    queue_seconds: float = 0.0  # ... and the seconds they waited for one, in all


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
        unwaited_bytes: resident bytes the compiles no request waits for may hold together;
            past it the largest are stopped (None: workers x the memory limit).
        early_dfa: workers send each compile's byte DFA ahead of its table (`early_dfa`,
            for first masks: compiler/service/first_mask.py); else `early_dfa`'s futures get None.
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
        unwaited_bytes: int | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
        early_dfa: bool = False,
    ):
        self.vocab = vocab
        self.sends_dfas = early_dfa
        self.limits = limits or CompileLimits()
        self.workers = default_workers() if workers is None else workers
        self.queue_size = queue_size
        self.slow_after_s = (
            max(0.5, self.limits.timeout_s / 10) if slow_after_s is None else slow_after_s
        )
        self.max_slow = 4 * self.workers if max_slow is None else max_slow
        # What compiles no request waits for may hold together (`_shed_unwaited`).
        self.unwaited_bytes = (
            self.workers * self.limits.memory_bytes if unwaited_bytes is None else unwaited_bytes
        )
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
        self._jobs: deque[Job] = deque()  # queued, in arrival order
        self._active: dict[str, Job] = {}  # queued or running, by constraint
        self._procs: list[_Proc] = []
        self._typical_s = _TYPICAL_S
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

    def submit(self, constraint: Constraint) -> Compiling[CompiledTable]:
        """A future of the compiled table; its exception is a ConstraintError,
        CompileLimitError or CompilerBusyError (at the request's deadline, while the compile
        goes on to its `outcome`). Never blocks.

        A constraint already queued or compiling is not compiled twice: the request joins
        that compile, with its own deadline.
        """
        return self._submit(constraint, TABLE_AND_DFA if self.sends_dfas else TABLE)

    def submit_first(self, constraint: Constraint) -> Compiling[CompiledTable | SentDfa]:
        """A future of the constraint's byte DFA, compact (a SentDfa), where a LazyTable can
        serve it (compiler/service/first_mask.py), else of its whole table; errors and joining as
        for `submit` (a FIRST compile is joined by FIRST compiles only). A FIRST compile's
        Retry-After is estimated as a whole compile's: too late, never too soon."""
        return self._submit(constraint, FIRST)

    def _submit(self, constraint: Constraint, mode: str) -> Compiling[Any]:
        with self._lock:
            if self._broken:
                return Compiling.ended(CompileLimitError(self._broken))
            if self._closed:
                return Compiling.ended(_shut_down())
            key = constraint.key_material()
            if mode == FIRST:
                key = f"{FIRST}:{key}"
            job = self._active.get(key)
            if job is None:
                if len(self._jobs) >= self.queue_size:
                    self.stats.busy += 1
                    retry = queued_estimate(len(self._jobs), self.workers, self._typical_s)
                    return Compiling.ended(
                        CompilerBusyError(
                            f"{len(self._jobs)} constraints are already waiting to be compiled, "
                            f"the most this server queues. Retry in {retry:.0f} s, or start "
                            "the server with a larger --compile-queue or --compile-workers.",
                            retry_after=retry,
                        )
                    )
                job = self._active[key] = Job(constraint, key, mode)
                self._jobs.append(job)
            answer: Compiling[Any] = Compiling()
            answer.follow(job.outcome)
            job.waiters.append(Waiter(answer, time.monotonic()))
        self._wake()
        return answer

    def early_dfa(self, constraint: Constraint) -> Future[tuple[Any, Any] | None] | None:
        """The byte DFA (next, accepting) of `constraint`'s compile in flight, sent before
        its token walk: a Future resolved with None when the worker sends none (a DFA over
        its early limit). None when no compile of it is queued or running."""
        with self._lock:
            job = self._active.get(constraint.key_material())
            return job.dfa if job is not None else None

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

    def gauges(self) -> dict[str, float]:
        """Queued, running and background compiles, live processes and compile CPU time,
        for /metrics."""
        with self._lock:
            running = [p for p in self._procs if p.job is not None]
            return {
                "compile_queue_depth": len(self._jobs),
                "compiles_running": len(running),
                "compiles_demoted": sum(p.demoted for p in running),
                "compiles_background": sum(job.late for job in self._active.values()),
                "compiles_sent_to_background": self.stats.background,
                "compile_cpu_seconds": self.stats.cpu_seconds,
                "compiles_started": self.stats.started,
                "first_compiles_started": self.stats.first_started,
                "compile_queue_seconds": self.stats.queue_seconds,
                "compiles_cpu_limited": self.stats.timeouts,
                "compiles_shed": self.stats.shed,
                "compiles_abandoned": self.stats.abandoned,
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
            jobs, self._active, self._jobs = list(self._active.values()), {}, deque()
            procs, self._procs = self._procs, []
        for proc in procs:
            proc.worker.kill()
        for job in jobs:
            shut = _shut_down()
            for waiter in job.waiters:
                settle(waiter.future, shut)
            settle(job.outcome, shut)
            settle(job.dfa, None)
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
            settle(future, outcome)
        done.clear()

    def _end(self, job: Job, outcome: object, done: list) -> None:
        """The compile is over: answer its waiters and its outcome (the cache's)."""
        self._active.pop(job.key, None)
        if job.late and not job.waiters:
            self.stats.background_done += 1
        for waiter in job.waiters:
            done.append((waiter.future, outcome))
        job.waiters.clear()
        done.append((job.outcome, outcome))
        done.append((job.dfa, None))  # no-op if the DFA came

    def _expire(self, now: float, done: list) -> None:
        if self._broken:
            while self._jobs:
                self._end(self._jobs.popleft(), CompileLimitError(self._broken), done)
        if not self._serving:  # the pool is starting: its start is not the compiles' time
            for job in list(self._jobs):
                waits = [now - w.since for w in job.waiters]
                if waits and min(waits) > self.start_timeout_s:
                    self._jobs.remove(job)
                    self.stats.busy += len(waits)
                    self._end(job, self._not_started(max(waits)), done)
            return
        ceiling = self.limits.cpu_s
        for proc in list(self._procs):
            job = proc.job
            if job is not None:
                # CPU time, not wall time, tells a costly schema from a starved one: on a
                # loaded machine a demoted compile can sit for seconds without running.
                cpu = proc.cpu_used(now)
                if cpu >= ceiling:
                    self._retire(proc)
                    self.stats.timeouts += 1
                    self.stats.cpu_seconds += cpu
                    self._end(job, self._too_costly(cpu), done)
                elif now - proc.started >= max(_STARVED_FACTOR * ceiling, _STARVED_MIN_S):
                    self._retire(proc)
                    self.stats.cpu_seconds += cpu
                    self._end(job, self._starved(now - proc.started, cpu), done)
            elif not proc.worker.ready and now - proc.worker.started > self.start_timeout_s:
                log.error(
                    "a compile worker did not start in %.0f s; replacing it",
                    now - proc.worker.started,
                )
                self._retire(proc)
        self._drop_abandoned(done)
        self._answer_late(now, done)
        self._shed_unwaited(done)

    def _drop_abandoned(self, done: list) -> None:
        """Stop the compiles whose every waiter was cancelled (the table cache cancels its
        future when every request that asked for the constraint left before an answer),
        queued or running. One a request was answered 429 for goes on: it is to retry."""
        running = {p.job: p for p in self._procs if p.job is not None}
        for job in list(self._active.values()):
            if job.late or not job.waiters or not all(w.future.cancelled() for w in job.waiters):
                continue
            proc = running.get(job)
            if proc is not None:
                self._retire(proc)
            elif job in self._jobs:
                self._jobs.remove(job)
            self.stats.abandoned += 1
            self._end(job, abandoned_error(), done)

    def _answer_late(self, now: float, done: list) -> None:
        """429 the requests whose deadline passed; their compiles go on in the background."""
        timeout, ceiling = self.limits.timeout_s, self.limits.cpu_s
        running = {p.job: p for p in self._procs if p.job is not None}
        for job in list(self._active.values()):
            if not any(now - w.since >= timeout for w in job.waiters):
                continue
            proc = running.get(job)
            grace = 0.0
            if proc is not None:
                cpu, wall = proc.cpu_used(now), now - proc.started
                progress = Progress.read(proc.worker.progress)
                estimate = running_estimate(cpu, wall, ceiling, progress)
                retry = job.retry_after(now, estimate, progress.position)
                # Its ceiling is under a second away at the CPU it gets: wait for that
                # answer rather than send a 429 that a retry would find to be a 400.
                if wall > 0 and ceiling - cpu <= MIN_RETRY_S * cpu / wall:
                    grace = MIN_RETRY_S
            else:
                position = self._jobs.index(job) if job in self._jobs else 0
                estimate = queued_estimate(position, self.workers, self._typical_s)
                retry = job.retry_after(now, estimate, (QUEUED, -position))
            late = [w for w in job.waiters if now - w.since >= timeout + grace]
            if not late:
                continue
            if not job.late:
                job.late = True
                self.stats.background += 1
            for waiter in late:
                job.waiters.remove(waiter)
                self.stats.busy += 1
                error = late_error(job, now - waiter.since, retry, proc is not None)
                done.append((waiter.future, error))

    def _shed_unwaited(self, done: list) -> None:
        """Renice the compiles that no request waits for any more (UNWAITED_NICE), and stop
        the largest of them while their resident memory
        together passes `unwaited_bytes`: each is bounded by --compile-memory, but up to
        `max_slow` of them ran at once (in a soak of hostile constraints the workers held
        6 GB beside the server). Stopped as busy, not remembered: a retry compiles again."""
        for proc in self._procs:
            job = proc.job
            if job is not None and job.late and not job.waiters and proc.demoted:
                if not proc.unwaited:
                    # Nobody waits for it now: it finishes on what the engine and the
                    # compiles that requests wait for leave (a demoted process is retired
                    # when it ends, so the niceness goes with it).
                    proc.worker.lower_priority(UNWAITED_NICE)
                    proc.unwaited = True
        unwaited = [p for p in self._procs if p.unwaited and p.job is not None]
        if not unwaited:
            return
        sizes = {p: p.worker.resident_bytes() for p in unwaited}
        total = sum(sizes.values())
        for proc in sorted(unwaited, key=sizes.__getitem__, reverse=True):
            if total <= self.unwaited_bytes:
                return
            job = proc.job
            assert job is not None
            self._retire(proc)
            total -= sizes[proc]
            self.stats.shed += 1
            self._end(job, self._shed(sizes[proc]), done)

    def _shed(self, size: int) -> CompilerBusyError:
        return CompilerBusyError(
            f"The compiler is busy: the constraint's compile went on with no request waiting "
            f"for it, holding {size / 2**20:.0f} MiB, and was stopped to make room. Retry "
            "later; if this persists, simplify the constraint.",
            retry_after=self.limits.timeout_s,
        )

    def _too_costly(self, cpu: float) -> CompileLimitError:
        return CompileLimitError(
            f"Compiling the constraint used more than {self.limits.cpu_s:g} s of CPU "
            "time and was stopped; it will be refused at once from now on. Simplify the "
            "schema (fewer optional properties, bounded strings and arrays, no deep nesting, "
            "smaller numeric ranges), or raise --compile-cpu-limit.",
            compile_seconds=cpu,
        )

    def _starved(self, wall: float, cpu: float) -> CompilerBusyError:
        return CompilerBusyError(
            f"The compiler is busy: the constraint's compile got {cpu:.3g} s of CPU time in "
            f"{wall:.3g} s and was stopped. The machine is overloaded; retry later, or start "
            "the server with more --compile-workers.",
            retry_after=self.limits.timeout_s,
        )

    def _not_started(self, waited: float) -> CompilerBusyError:
        return CompilerBusyError(
            f"The compiler is starting: no compile worker became ready in {waited:.3g} s. "
            "Retry; if this persists, see the server log (a loaded machine or a low "
            "--compile-memory).",
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
                if DEMOTED_NICE:
                    proc.worker.lower_priority(DEMOTED_NICE)
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
            proc = idle.pop(0)
            proc.worker.progress[:] = 0  # the last compile's: this one's is written after
            try:
                proc.worker.conn.send((job.constraint, job.mode))
            except OSError:  # the process died while idle: requeue the job
                self._retire(proc)
                self._jobs.appendleft(job)
                continue
            proc.job, proc.started = job, now
            self.stats.started += 1
            self.stats.first_started += job.mode == FIRST
            self.stats.queue_seconds += now - job.queued_at
            proc.cpu_at_start = proc.worker.cpu_seconds() or 0.0

    def _on_message(self, proc: _Proc, done: list) -> None:
        try:
            kind, payload = proc.worker.conn.recv()
        except (EOFError, OSError):
            self.stats.worker_deaths += 1
            job = proc.job
            if job is not None:
                self.stats.cpu_seconds += proc.cpu_used(time.monotonic())
            self._retire(proc)
            if job is not None:
                self._end(job, memory_error(self.limits), done)
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
                    queued.queued_at = now
                    for waiter in queued.waiters:
                        waiter.since = now
            if sum(p.worker.ready for p in self._procs) >= self.workers + _RESERVE:
                self._ready.set()
            return
        if kind == "dfa":  # ahead of the table: the compile goes on
            if proc.job is not None:
                done.append((proc.job.dfa, payload))
            return
        job, proc.job = proc.job, None
        if job is None:
            return
        now = time.monotonic()
        self.stats.compiles += 1
        self.stats.cpu_seconds += proc.cpu_used(now)
        outcome: object
        if kind == "ok":
            self._typical_s = 0.8 * self._typical_s + 0.2 * (now - proc.started)
            try:
                outcome = CompiledTable.from_bytes(payload)
            except (ValueError, KeyError) as e:  # not reachable unless the worker is broken
                log.error("a compile worker sent a malformed reply: %r", e)
                outcome = unexpected_error()
        elif kind == "first":
            outcome = SentDfa(*payload)
        else:
            outcome = rebuild_error(*payload)
        self._end(job, outcome, done)
        if proc.demoted:
            self._retire(proc)

    def _start_failed(self) -> None:
        self._start_failures += 1
        # A worker already starting may fail after the pool gave up: the reason stays the
        # one the queued compiles were (or are being) told.
        if self._start_failures >= _MAX_START_FAILURES and self._broken is None:
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
        due = [now + 1.0]  # also how often a running compile's CPU time is read
        if self._serving:
            for job in self._active.values():
                deadlines = (w.since + self.limits.timeout_s for w in job.waiters)
                due.extend(d for d in deadlines if d > now)  # past ones are in their grace
        else:
            due.extend(w.since + self.start_timeout_s for job in self._jobs for w in job.waiters)
        for proc in self._procs:
            if proc.job is not None:
                if not proc.demoted:
                    due.append(proc.started + self.slow_after_s)
        return max(0.0, min(due) - now)
