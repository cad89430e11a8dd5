"""One sequence being generated: request-level state, kept apart from the engine's."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from gclm.compiler import TokenVocabulary
from gclm.masking import ConstraintState
from gclm.server.engine.output import OutputTracker
from gclm.server.engine.protocol import GenerationRequest, StreamEvent, TokenLogprob


class Outbox:
    """The events a step sends, handed to each event loop in one call at the step's end.

    A `call_soon_threadsafe` writes to the loop's self-pipe and wakes it: one per token
    per row was most of a step's bookkeeping at batch 32 (1.1 of 1.4 ms). Events sent from
    the engine thread wait here until `flush` (the engine calls it once a step's tokens
    are taken, before it drafts, and at the step's end); an event sent from any other
    thread goes at once, as before.
    """

    def __init__(self) -> None:
        self.owner: int | None = None  # the engine thread's ident, set when it starts
        self._pending: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Any]]] = {}

    def send(
        self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[StreamEvent], event: Any
    ) -> None:
        if threading.get_ident() != self.owner:
            _hand(loop, queue.put_nowait, event)
            return
        self._pending.setdefault(loop, []).append((queue, event))

    def flush(self) -> None:
        """Hand every event held to its loop, one call per loop, in the order sent."""
        pending, self._pending = self._pending, {}
        for loop, items in pending.items():
            _hand(loop, _deliver, items)


def _hand(loop: asyncio.AbstractEventLoop, fn: Any, arg: Any) -> None:
    """`fn(arg)` on `loop`; nothing once the loop is closed (nobody is left to read the
    events of a request whose loop ended, and the engine thread must not die of it)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, arg)


def _deliver(items: list[tuple[asyncio.Queue, Any]]) -> None:
    for queue, event in items:
        queue.put_nowait(event)


@dataclass(eq=False)
class Sequence:
    """A submitted request's progress on the transformers engine: its KV slot's bookkeeping
    and sampling state here, its output in `output` (server/engine/output.py). Its events go
    to the event loop it was submitted on.

    A constrained, budget-aware sequence ends with finish_reason "stop" as soon as its output
    is complete and either the budget is spent or no token could continue it (the tracker's
    rule); its stop strings are ignored, since cutting a constrained output short would break
    its validity.
    """

    request: GenerationRequest
    request_id: str
    loop: asyncio.AbstractEventLoop
    vocab: TokenVocabulary
    events: asyncio.Queue[StreamEvent] = field(default_factory=asyncio.Queue)
    output: OutputTracker = field(init=False)
    generator: torch.Generator | None = None
    cancelled: bool = False
    queued_at: float = 0.0  # time.monotonic() when queued, and when given a KV slot
    admitted_at: float = 0.0
    outbox: Outbox | None = None  # the engine's: events wait for the step's end

    def __post_init__(self) -> None:
        self.output = OutputTracker(self.request, self.vocab.token_bytes, self._send)
        if self.request.params.seed is not None:
            self.generator = torch.Generator().manual_seed(self.request.params.seed)

    @property
    def constraint_state(self) -> ConstraintState | None:
        return self.output.constraint_state

    @property
    def tokens_left(self) -> int:
        return self.output.tokens_left

    @property
    def output_ids(self) -> list[int]:
        """The sampled tokens, EOS excluded (the penalties read them)."""
        return self.output.output_ids

    @property
    def finished(self) -> bool:
        return self.output.finished

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens whose KV the store already held (set on admission)."""
        return self.output.cached_tokens

    @cached_tokens.setter
    def cached_tokens(self, value: int) -> None:
        self.output.cached_tokens = value

    def update(
        self, token: int, eos_ids: frozenset[int], logprob: TokenLogprob | None = None
    ) -> bool:
        """Take the sampled token (and its logprob, when asked for); emit text; return True
        when the sequence is done."""
        if self.cancelled:
            return True
        reason = self.output.take((token,), () if logprob is None else (logprob,), eos_ids=eos_ids)
        if reason is None:
            return False
        self.output.finish(reason)
        return True

    def finish(self, reason: str) -> None:
        """End the output now ("cancelled"; see OutputTracker.finish)."""
        self.output.finish(reason)

    def fail(self, error: Exception) -> None:
        self.output.fail(error)

    def _send(self, event: StreamEvent) -> None:
        if self.outbox is None:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        else:
            self.outbox.send(self.loop, self.events, event)
