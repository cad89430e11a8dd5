"""The engine's constraint service: one per engine, for both engines.

It holds what turns a request's constraint into what its rows mask with (`prepare`,
server/engine/prepare.py, over `compile` here): the table cache
(compiler/service/cache.py) and the compile pool behind it, the threads that look tables
up and build their mask rows off the event loop and off the engine's thread, and the budget
policies of the vocabulary: it implements gclm.server.engine.protocol.ConstraintService. An engine's
/metrics gauges come from `gauges`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cached_property
from typing import TYPE_CHECKING, Any

from gclm.compiler import (
    CompiledTable,
    CompilerPool,
    Constraint,
    FirstTables,
    TableCache,
    TokenVocabulary,
)
from gclm.errors import CompilerBusyError
from gclm.masking import mask_table
from gclm.masking.graceful import GracefulPolicy
from gclm.masking.policy import BudgetPolicy
from gclm.server.engine.prepare import PreparesConstraints

if TYPE_CHECKING:
    from gclm.compiler import LazyTable


_DEFAULT_TIMEOUT_S = 10.0  # without a pool (tests): the server's default --compile-timeout
_WAIT_GRACE_S = 1.0
_GROW_RETRY_S = 5.0  # a grown first mask's NFA is bounded (compiler/service/first_mask.py): seconds


class Constraints(PreparesConstraints):
    """Tables for one vocabulary: looked up, compiled, their mask rows built, and a
    request's constraint prepared over them (`prepare`).

    Args:
        vocab: the engine's vocabulary.
        cache: the table cache (it submits to `pool`).
        pool: the compile workers, read only for their gauges (None: the cache compiles
            some other way, as in tests).
        threads: lookups at once (a disk hit reads its file in one).
        first_masks: whether `compile` may answer with a LazyTable, where the cache carries
            a source of them (False: whole tables only, for an engine whose masks are made
            elsewhere, as vLLM's).
    """

    def __init__(
        self,
        vocab: TokenVocabulary,
        cache: TableCache,
        pool: CompilerPool | None = None,
        *,
        threads: int = 4,
        first_masks: bool = True,
    ) -> None:
        self.vocab = vocab
        self.cache = cache
        self.pool = pool
        source = cache.first_masks if first_masks else None
        self.first_tables = FirstTables(cache, source) if source is not None else None
        self._lookups = ThreadPoolExecutor(threads, thread_name_prefix="gclm-lookup")
        # How long a request waits for its table: the pool's compile timeout, and a grace
        # for the pool's own answer at that timeout to come first.
        timeout = pool.limits.timeout_s if pool is not None else _DEFAULT_TIMEOUT_S
        self._wait_s = timeout + _WAIT_GRACE_S
        # The requests waiting for each compile in flight (the cache's future), on any loop.
        self._waiting: dict[Future[Any], int] = {}
        self._waiting_lock = threading.Lock()

    @property
    def grows_pushdown(self) -> bool:
        return self.first_tables is not None and self.first_tables.source.grows

    async def compile(
        self, constraint: Constraint, *, first_mask: bool = False, deadline: float | None = None
    ) -> CompiledTable | LazyTable:
        """The constraint's table, its mask rows built; with `first_mask` (and
        `first_masks`), a LazyTable while it compiles where the cache makes them
        (FirstTables.fetch: the in-process engine's, with `--first-mask lazy`). Raises
        the compile's ConstraintError; never blocks the event loop."""
        loop = asyncio.get_running_loop()
        fetch: Callable[[Constraint], Future[Any]] = (
            self.first_tables.fetch if first_mask and self.first_tables else self.cache.fetch
        )
        future = await loop.run_in_executor(self._lookups, fetch, constraint)
        if future.done():  # cached, on disk or remembered: no wait, whatever the deadline
            table = future.result()
        else:
            table = await self._wait(future, deadline)
        if isinstance(table, CompiledTable):
            # Build the mask rows here, not on the engine thread's first step (a cache that
            # measures with masking.masks.table_memory has built them already).
            await loop.run_in_executor(self._lookups, mask_table, table)
        return table

    async def _wait(self, future: Future[Any], deadline: float | None) -> CompiledTable | LazyTable:
        """The compile's outcome, or a CompilerBusyError past the wait (`deadline`)."""
        # shield: a client that leaves must not cancel the compile other requests share.
        compiled = asyncio.wrap_future(future)
        # Read its outcome even when nobody waits any more (else asyncio logs it as lost).
        compiled.add_done_callback(lambda f: f.cancelled() or f.exception())
        wait_s = self._wait_s
        if deadline is not None:  # a request's one wait, over every table it asks for
            wait_s = max(0.0, min(wait_s, deadline - time.monotonic()))
        with self._waiting_lock:
            self._waiting[future] = self._waiting.get(future, 0) + 1
        left = False
        try:
            return await asyncio.wait_for(asyncio.shield(compiled), wait_s)
        except asyncio.CancelledError:
            left = True  # the client went away (streaming.until_disconnected)
            raise
        except asyncio.TimeoutError:  # the builtin TimeoutError only from Python 3.11 on
            # The pool answers its own compiles at the timeout; this is for the work it does
            # not time: a first mask grown in this process, queued or running. Its client
            # is told to retry: the compile must go on whoever else leaves.
            self.cache.keep(future)
            raise CompilerBusyError(
                "The compiler is busy: after --compile-timeout the constraint is still "
                "compiling. It goes on in the background and its table "
                "will be remembered; retry in a few seconds.",
                retry_after=_GROW_RETRY_S,
            ) from None
        finally:
            with self._waiting_lock:
                others = self._waiting.pop(future) - 1
                if others:
                    self._waiting[future] = others
            if left and not others and not future.done():
                # Nobody is left to answer: stop its compile (TableCache.abandon).
                self.cache.abandon(future)

    @cached_property
    def _graceful(self) -> GracefulPolicy:
        return GracefulPolicy.for_vocab(self.vocab.token_bytes)

    def budget_policy(self, name: str) -> BudgetPolicy | None:
        """The graceful policy for this vocabulary (one per engine), or None for "none"."""
        return self._graceful if name == "graceful" else None

    def gauges(self) -> dict[str, float]:
        """The table cache's and the compile pool's gauges, for /metrics."""
        gauges: dict[str, float] = dict(self.cache.gauges())
        if self.first_tables is not None:
            gauges.update(self.first_tables.gauges())
        if self.pool is not None:
            gauges.update(self.pool.gauges())
        return gauges

    def close(self) -> None:
        self._lookups.shutdown(wait=False, cancel_futures=True)
