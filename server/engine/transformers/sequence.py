"""One sequence being generated: request-level state, kept apart from the engine's."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import torch

from gclm.compiler.vocabulary import TokenVocabulary
from gclm.masking import ConstraintState
from gclm.server.engine.output import OutputTracker
from gclm.server.engine.protocol import GenerationRequest, StreamEvent, TokenLogprob


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
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)
