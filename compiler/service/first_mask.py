"""LazyTables from the byte DFAs that compile workers build, in the server's process.

A whole compile builds a constraint's byte DFA, then walks the vocabulary through it from
every state and computes distances (compiler/whole/compile.py): at 200k tokens the walk is most of
the compile, and nobody needs it unless a request's budget binds (graceful closure plans
over the whole table) or it thinks first. So a request that can start on first masks asks
for a FIRST compile (`FirstMasks.compile`): the worker builds the byte DFA alone, and
`FirstMasks` makes it a LazyTable here, walked state by state as generation reaches states.
The table cache keeps that LazyTable by key (`FirstTables.fetch`); the whole table is
compiled only when a request needs it. A whole compile in flight also sends its DFA ahead
(`FirstMasks.__call__`), so that a request arriving meanwhile need not wait for its walk.

No LazyTable is made, and the whole table answers, when the DFA is over the compile's state
limit, when some state reaches acceptance only through a byte that is no token by itself, or
when no output can be spelled at all (the compile's own error then answers the request). A
FIRST compile then goes on to the whole table in the same worker, so it costs no more than
the whole compile. A FIRST compile sends its DFA compact, a column per class of bytes; a
whole compile sends its DFA ahead only up to `worker.EARLY_DFA_MAX_STATES` states.

With `grow` (the server's default), a FIRST compile is not sent to a worker at all where
compiler/grown/regex_parse.py reads the constraint's regex: its NFA is built here (compiled code
that releases the GIL: a few ms at the median, up to about 2-4 s at `MAX_GROWN_NFA_STATES`),
on the light lane up to LIGHT_NFA_STATES and on the heavy lane past it (see the lanes'
constants), and the byte DFA grows from it as walks read it
(compiler/grown/lazy_dfa.py): outlines-core's determinization of the whole DFA, seconds on large
schemas, is left to the whole compile, for the requests that need one. A regex the parser
refuses, an NFA past that size, or one no LazyTable serves goes to the worker as before.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Protocol

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.deadline import OutOfTime, work_deadline
from gclm.compiler.front.regex import to_regex
from gclm.compiler.grown.lazy_dfa import GrowingLazyTable
from gclm.compiler.grown.lazy_table import LazyTable
from gclm.compiler.grown.pushdown import PushdownTable
from gclm.compiler.grown.regex_nfa import NfaTooLarge
from gclm.compiler.grown.regex_parse import Unsupported
from gclm.compiler.service.compile_job import Compiling, copy_outcome, settle
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.byte_dfa import ByteDfa, byte_dfa
from gclm.compiler.whole.tables import UNREACHABLE, CompiledTable
from gclm.errors import CompileLimitError, CompilerBusyError, ConstraintError

log = logging.getLogger("gclm.compiler")

_WARM_UP_REGEX = "[a-z]{2,4}"  # a regex whose byte DFA takes no time to build
# Past this, a grown table's NFA is left to a worker's outlines-core DFA. In the server's
# process 0.8-1.7 M states took 0.4-2.2 s (outlines-core's whole DFA: 2.3-4.6 s), about 250
# bytes a state at the peak and 65 held while the table is cached; the workers have their
# own memory and CPU limits for what is larger (none of the dev split since subtrees are
# shared: its largest, Github_hard o21076, makes 742 k states).
MAX_GROWN_NFA_STATES = 1_000_000
# Two lanes grow NFAs: the light one every new constraint's first, up to LIGHT_NFA_STATES
# (the dev split's 524 regexes: p50 553, p90 20 k, p99 119 k NFA states, 9 past 100 k, the
# largest 742 k; regexes p99 1.27 M characters, the longest 3.2 M); the heavy one the
# larger, up to
# MAX_GROWN_NFA_STATES (about 2-4 s at the limit on a loaded 2-core machine, some 250 bytes
# a state while it runs). Past LIGHT_LANE_DEPTH / GROW_LANE_DEPTH queued or running, a
# constraint's first masks come from a worker instead, which is bounded by its own limits.
LIGHT_NFA_STATES = 100_000
# Seconds the light lane spends writing a regex (Python: JSON Schema normalisation, a
# grammar's expansion) before it leaves the constraint to a worker: the dev split's slowest
# to_regex took 60-90 ms, and one of its schemas (WashingtonPost wp_124) minutes.
LIGHT_REGEX_SECONDS = 1.0
LIGHT_REGEX_CHARS = 1_000_000  # a longer regex goes to the heavy lane at once
# A pushdown table (compiler/grown/pushdown.py) that takes longer than LIGHT_REGEX_SECONDS to
# build is built again on the heavy lane, within this (MaskBench's Kubernetes kb_1161, with
# each of its $refs a call: 13 s here); past it, the constraint is unrolled as before.
HEAVY_PUSHDOWN_SECONDS = 60.0
HEAVY_NICE = 10  # the heavy lane's thread: it yields the cores to the engine's threads
LIGHT_LANE_DEPTH = 8
GROW_LANE_DEPTH = 2


class FirstMasksSource(Protocol):
    """Where FirstTables' LazyTables come from: FirstMasks below, or a test's fake."""

    # Whether `compile` grows tables in this process (a `pushdown` grammar's among them).
    grows: bool

    def __call__(self, constraint: Constraint) -> Future[LazyTable | None] | None:
        """The LazyTable of `constraint`'s whole compile in flight, the same Future for
        every call during one compile (None in it when there is none to be had), or None
        when no whole compile of it is in flight."""
        ...

    def compile(self, constraint: Constraint) -> Future[CompiledTable | LazyTable | None]:
        """A compile of `constraint`'s byte DFA alone: its LazyTable, or its whole table
        where no LazyTable serves it, or None (then compile the whole table); a Compiling
        where the compile may go on past a busy answer."""
        ...

    def from_dfa(self, data: bytes) -> Future[LazyTable | None]:
        """The LazyTable of a byte DFA stored on disk (`ByteDfa.to_bytes`), or None when
        the bytes are damaged."""
        ...

    def gauges(self) -> dict[str, float]:
        """Counters for /metrics."""
        ...

    def wait_warm(self, timeout: float | None = None) -> bool:
        """Block until what the source compiles with is loaded (True), or `timeout`."""
        ...


class FirstMasks:
    """`TableCache`'s `first_masks`: LazyTables of FIRST compiles, and of whole compiles in
    flight.

    Args:
        early_dfa: the pool's `early_dfa` (a Future of a compile's (next, accepting), or
            None when nothing of the constraint is compiling).
        vocab: the vocabulary the tables are compiled for.
        submit_first: the pool's `submit_first` (None: `compile` is not offered).
        grow: `compile` grows the DFA here where it can (see the module's docstring).
    """

    def __init__(
        self,
        early_dfa: Any,
        vocab: TokenVocabulary,
        submit_first: Any | None = None,
        *,
        grow: bool = False,
    ) -> None:
        self._early_dfa = early_dfa
        self._submit_first = submit_first
        self.vocab = vocab
        self.grows = grow
        self.grown = 0  # tables grown here instead of a worker's FIRST compile
        self.grow_seconds = 0.0
        self._growing = 0  # grows queued or running on `_grower`
        # Its own thread: an NFA can take a second, and the DFAs above must not wait.
        self._grower = ThreadPoolExecutor(1, thread_name_prefix="gclm-grow") if grow else None
        # NFAs past LIGHT_NFA_STATES grow on a thread of their own, so that small ones do
        # not wait behind them.
        self._heavy = (
            ThreadPoolExecutor(1, thread_name_prefix="gclm-grow-heavy", initializer=_yield_cpu)
            if grow
            else None
        )
        self._heavy_growing = 0  # grows queued or running on `_heavy`
        # One thread: a LazyTable's bounds take a millisecond or so; never the pool's thread.
        self._builder = ThreadPoolExecutor(1, thread_name_prefix="gclm-first-mask")
        # One LazyTable per compile, however many requests join it, by its DFA's future
        # (held by the compile's Job while it runs).
        self._built: weakref.WeakKeyDictionary[Future[Any], Future[LazyTable | None]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        self._warm = self._builder.submit(warm_up, vocab)

    def wait_warm(self, timeout: float | None = None) -> bool:
        """Block until the compiled functions a grow uses are loaded (True), or `timeout`.

        On a cold numba cache (a fresh install, a new cache volume) compiling them takes
        30-45 s on a loaded 2-core machine; a request's grow in that time waits for
        numba's lock and gets its 429 at --compile-timeout. A server waits for this before
        it serves, as it waits for its compile workers."""
        try:
            self._warm.result(timeout)
        except FutureTimeout:  # the builtin TimeoutError only from Python 3.11 on
            return False
        return True

    def __call__(self, constraint: Constraint) -> Future[LazyTable | None] | None:
        dfa = self._early_dfa(constraint)
        if dfa is None:
            return None
        with self._lock:
            out = self._built.get(dfa)
            if out is not None:
                return out
            out = self._built[dfa] = Future()
        dfa.add_done_callback(lambda f: self._builder.submit(self._build, f, out))
        return out

    def compile(self, constraint: Constraint) -> Compiling[CompiledTable | LazyTable | None]:
        """A FIRST compile of `constraint`: its LazyTable, or its whole table where no
        LazyTable serves it (None where the worker's DFA turns out unservable here: then
        compile the whole table). Errors as the pool's; past a busy answer the compile's
        `outcome` is made the same way."""
        assert self._submit_first is not None, "FirstMasks was made without submit_first"
        with self._lock:
            lane_free = self._grower is not None and self._growing < LIGHT_LANE_DEPTH
            if lane_free:
                self._growing += 1
        if not lane_free:
            if constraint.pushdown:  # grown here or nowhere: no worker makes its masks
                return Compiling.ended(
                    CompilerBusyError(
                        "The server is growing other constraints' masks; retry shortly.",
                        retry_after=1.0,
                    )
                )
            # A worker's FIRST compile instead: a new constraint is not queued behind
            # others (the pool demotes slow compiles, and bounds each by CPU and memory).
            return self._made(self._submit_first(constraint))
        assert self._grower is not None  # lane_free
        out: Compiling[CompiledTable | LazyTable | None] = Compiling()
        self._grower.submit(self._grow, constraint, out)
        return out

    def _grow(
        self, constraint: Constraint, out: Compiling[CompiledTable | LazyTable | None]
    ) -> None:
        """`constraint`'s GrowingLazyTable into `out` (an NFA past LIGHT_NFA_STATES is
        handed to the heavy lane), else a worker's FIRST compile; nothing where `out` was
        cancelled while queued (every request that asked for it left)."""
        try:
            if not out.cancelled() and not self._grow_pushdown(constraint, out):
                self._grow_here(constraint, out, None)
        finally:
            with self._lock:
                self._growing -= 1

    def _grow_pushdown(
        self,
        constraint: Constraint,
        out: Compiling[CompiledTable | LazyTable | None],
        seconds: float = LIGHT_REGEX_SECONDS,
    ) -> bool:
        """A `pushdown` constraint's PushdownTable into `out` (or its error), within
        `seconds`; past them on the light lane, again on the heavy lane within
        HEAVY_PUSHDOWN_SECONDS. False where it has no recursion to keep (a grammar whose
        rules recurse only at their ends: its regex is exact; a schema whose recursion
        cannot be kept as calls: it is unrolled), or it took longer still (unrolled)."""
        if not constraint.pushdown:
            return False
        started = time.perf_counter()
        try:
            with work_deadline(seconds):
                table = PushdownTable.of_constraint(constraint, self.vocab)
            if table is None:
                return False
        except OutOfTime:
            heavy = seconds < HEAVY_PUSHDOWN_SECONDS
            return heavy and self._to_heavy_pushdown(constraint, out)
        except ConstraintError as e:
            out.end(e)
            return True
        except (Unsupported, ValueError):
            return False  # a regex part the parser does not read: unrolled
        except BaseException as e:  # never leave `out` unanswered
            log.exception("could not grow the pushdown masks of a grammar")
            out.end(e)
            return True
        table.compile_seconds = time.perf_counter() - started
        with self._lock:
            self.grown += 1
            self.grow_seconds += table.compile_seconds
        out.end(table)
        return True

    def _grow_heavy(
        self, constraint: Constraint, out: Compiling[CompiledTable | LazyTable | None], regex: str
    ) -> None:
        try:
            if not out.cancelled():
                self._grow_here(constraint, out, regex)
        finally:
            with self._lock:
                self._heavy_growing -= 1

    def _to_heavy_pushdown(
        self, constraint: Constraint, out: Compiling[CompiledTable | LazyTable | None]
    ) -> bool:
        """Queue a slow pushdown build on the heavy lane, if it has room (False: none)."""
        with self._lock:
            if self._heavy is None or self._heavy_growing >= GROW_LANE_DEPTH:
                return False
            self._heavy_growing += 1
        self._heavy.submit(self._grow_pushdown_heavy, constraint, out)
        return True

    def _grow_pushdown_heavy(
        self, constraint: Constraint, out: Compiling[CompiledTable | LazyTable | None]
    ) -> None:
        try:
            if not out.cancelled() and not self._grow_pushdown(
                constraint, out, HEAVY_PUSHDOWN_SECONDS
            ):
                self._grow_here(constraint, out, None)
        finally:
            with self._lock:
                self._heavy_growing -= 1

    def _to_heavy_lane(
        self, constraint: Constraint, out: Compiling[CompiledTable | LazyTable | None], regex: str
    ) -> bool:
        """Queue a large NFA on the heavy lane, if it has room (False: it has none)."""
        with self._lock:
            if self._heavy is None or self._heavy_growing >= GROW_LANE_DEPTH:
                return False
            self._heavy_growing += 1
        self._heavy.submit(self._grow_heavy, constraint, out, regex)
        return True

    def _grow_here(
        self,
        constraint: Constraint,
        out: Compiling[CompiledTable | LazyTable | None],
        regex: str | None,
    ) -> None:
        """Grow `constraint`'s table; `regex` None: on the light lane (its regex written
        here, its NFA at most LIGHT_NFA_STATES), else on the heavy lane."""
        started = time.perf_counter()
        table = None
        try:
            heavy = regex is not None
            if regex is None:
                with work_deadline(LIGHT_REGEX_SECONDS):
                    regex = to_regex(constraint).regex
                # A long regex's NFA is large more often than not: parse it once, there.
                if len(regex) > LIGHT_REGEX_CHARS and self._to_heavy_lane(constraint, out, regex):
                    return
            limit = MAX_GROWN_NFA_STATES if heavy else LIGHT_NFA_STATES
            table = GrowingLazyTable.of_regex(regex, self.vocab, limit)
            if table.upper[table.initial] == UNREACHABLE:
                table = None  # nothing to spell: the whole compile's error answers
        except NfaTooLarge:
            # NfaTooLarge comes from the parse, after the regex was written
            if not heavy and regex is not None and self._to_heavy_lane(constraint, out, regex):
                return
        except OutOfTime:  # writing its regex is slow: a worker's, with its CPU limit
            pass
        except CompileLimitError as e:  # the worker would refuse it the same way
            out.end(e)
            return
        except (Unsupported, ValueError, ConstraintError):
            # Not read by the parser, too large, not served, or refused by to_regex: the
            # worker's compile answers, with outlines-core's DFA or with its error.
            pass
        except Exception:  # a bug: the worker's compile answers instead
            log.exception("could not grow the first masks of a constraint")
        if table is None:
            try:
                assert self._submit_first is not None, "FirstMasks was made without submit_first"
                sent = self._made(self._submit_first(constraint))
            except BaseException as e:  # never leave `out` unanswered
                out.end(e)
                return
            _follow(sent, out)
            return
        table.compile_seconds = time.perf_counter() - started
        with self._lock:
            self.grown += 1
            self.grow_seconds += table.compile_seconds
        out.end(table)

    def gauges(self) -> dict[str, float]:
        """Tables grown here, and the seconds their NFAs took, for /metrics."""
        with self._lock:
            return {"first_masks_grown": self.grown, "first_mask_grow_seconds": self.grow_seconds}

    def from_dfa(self, data: bytes) -> Future[LazyTable | None]:
        """The LazyTable of a byte DFA the table cache stored (`ByteDfa.to_bytes`), made on
        this object's thread; None when the bytes are damaged or it cannot serve."""
        out: Future[LazyTable | None] = Future()

        def make() -> None:
            try:
                out.set_result(lazy_table(ByteDfa.from_bytes(data), self.vocab))
            except (ValueError, KeyError, OSError) as e:
                log.warning("ignoring a damaged stored byte DFA (%s)", e)
                out.set_result(None)

        self._builder.submit(make)
        return out

    def _made(self, sent: Compiling[Any]) -> Compiling[CompiledTable | LazyTable | None]:
        """What the pool's FIRST compile `sent` makes, and its outcome made the same way;
        cancelling it cancels `sent` (the pool then stops the compile: TableCache.abandon)."""
        out: Compiling[CompiledTable | LazyTable | None] = Compiling()
        sent.add_done_callback(lambda _: self._builder.submit(self._make, sent, out))
        out.add_done_callback(lambda f: f.cancelled() and sent.cancel())
        return out

    def _make(self, sent: Compiling[Any], out: Compiling[CompiledTable | LazyTable | None]) -> None:
        if out.done():  # cancelled: nobody waits for it
            return
        try:
            result = sent.result()
        except CompilerBusyError as e:  # the compile goes on: its outcome made the same way
            sent.outcome.add_done_callback(
                lambda f: self._builder.submit(self._make_outcome, f, out.outcome)
            )
            settle(out, e)
            return
        except BaseException as e:
            out.end(e)
            return
        out.end(self._table_of(result))

    def _make_outcome(self, compiled: Future[Any], outcome: Future[Any]) -> None:
        """A FIRST compile that went on past its requests' answer ended: its outcome, made
        as the answer would have been."""
        try:
            result: object = self._table_of(compiled.result())
        except BaseException as e:
            result = e
        settle(outcome, result)

    def _table_of(self, result: Any) -> CompiledTable | LazyTable | None:
        """A FIRST compile's result as a table: the whole table it made, or a LazyTable of
        the DFA it sent (None where that cannot serve)."""
        if isinstance(result, CompiledTable):
            return result
        try:
            dfa = ByteDfa(result.next, result.accepting, result.classes)
            table = lazy_table(dfa, self.vocab)
        except Exception:  # a bug: the whole table answers instead
            log.exception("could not build the first masks of a constraint")
            return None
        if table is not None:
            table.compile_seconds = result.seconds
        return table

    def _build(self, dfa: Future[tuple[Any, Any] | None], out: Future[LazyTable | None]) -> None:
        try:
            arrays = dfa.result()
            out.set_result(None if arrays is None else lazy_table(ByteDfa(*arrays), self.vocab))
        except BaseException as e:  # a bug: the request waits for the table instead
            log.exception("could not build the first masks of a constraint")
            out.set_exception(e)

    def close(self) -> None:
        self._builder.shutdown(wait=False, cancel_futures=True)
        for lane in (self._grower, self._heavy):
            if lane is not None:
                lane.shutdown(wait=False, cancel_futures=True)


def _follow(sent: Compiling[Any], out: Compiling[Any]) -> None:
    """`sent`'s answer into `out`, and its outcome into `out`'s; cancelling `out` cancels
    `sent`."""
    out.follow(sent.outcome)
    sent.add_done_callback(lambda done: copy_outcome(done, out))
    out.add_done_callback(lambda f: f.cancelled() and sent.cancel())


def _yield_cpu() -> None:
    """Lower the calling thread's priority (Linux: a thread is a task of its own): a large
    NFA grows beside the engine's steps and the small constraints, not ahead of them."""
    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), HEAVY_NICE)
        except OSError:  # not permitted: it grows at the server's priority
            pass


def warm_up(vocab: TokenVocabulary) -> None:
    """The vocabulary's trie and the compiled walks, before the first request: else its
    first state's walk would compile them on the engine's thread, stalling the batch."""
    try:
        table = lazy_table(byte_dfa(_WARM_UP_REGEX), vocab)
        if table is not None:
            table.forward_row(table.initial)
            table.spelled_upper(table.initial)
        grown = GrowingLazyTable.of_regex(_WARM_UP_REGEX, vocab)
        grown.forward_row(grown.initial)
        grown.spelled_upper(grown.initial)
    except Exception:  # not fatal: the first request pays for it instead
        log.exception("could not warm up the first masks")


def lazy_table(dfa: ByteDfa, vocab: TokenVocabulary) -> LazyTable | None:
    """The DFA's LazyTable, or None when it cannot serve it (see the module's docstring)."""
    try:
        table = LazyTable(dfa, vocab)
    except ValueError:
        return None
    if table.upper[table.initial] == UNREACHABLE:
        return None
    return table
