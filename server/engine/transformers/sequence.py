"""One sequence being generated: request-level state, kept apart from the engine's."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import torch

from gclm.compiler.vocabulary import TokenVocabulary
from gclm.errors import GclmError, InternalError
from gclm.masking import ConstraintState
from gclm.masking.masks import is_lazy
from gclm.masking.reasoning import ReasoningState, ThinkingWatch
from gclm.server.engine.protocol import (
    ErrorEvent,
    FinishEvent,
    GenerationRequest,
    StreamEvent,
    TokenEvent,
    TokenLogprob,
)
from gclm.server.engine.shared import out_of_budget
from gclm.server.engine.thinking import MarkerHold
from gclm.server.engine.transformers.detokenize import TextStream


@dataclass(eq=False)
class Sequence:
    """A submitted request's progress. Its events go to the event loop it was submitted on.

    Budget: `tokens_left` counts the token about to be sampled. A constrained, budget-aware
    sequence ends with finish_reason "stop" as soon as its output is complete and either the
    budget is spent or no token could continue it; its stop strings are ignored, since
    cutting a constrained output short would break its validity.
    """

    request: GenerationRequest
    request_id: str
    loop: asyncio.AbstractEventLoop
    vocab: TokenVocabulary
    events: asyncio.Queue[StreamEvent] = field(default_factory=asyncio.Queue)
    constraint_state: ConstraintState | None = None
    text: TextStream = field(init=False)
    generator: torch.Generator | None = None
    last_token: int = -1
    generated: int = 0  # tokens sampled, EOS included
    output_ids: list[int] = field(default_factory=list, init=False)  # sampled, EOS excluded
    cancelled: bool = False
    finished: bool = False
    cached_tokens: int = 0  # prompt tokens whose KV the store already held (set on admission)
    queued_at: float = 0.0  # time.monotonic() when queued, and when given a KV slot
    admitted_at: float = 0.0
    # A thinking request's phase: its ReasoningState, or a ThinkingWatch without a constraint.
    thinking: ReasoningState | ThinkingWatch | None = None
    # The text of the thinking's last tokens that may be the start of its end marker: held
    # back until the marker completes (dropped) or the match breaks (sent).
    _held: MarkerHold = field(default_factory=MarkerHold, init=False)
    # Taken but not yet sent: a token that completes no character waits for the next one.
    _unsent_ids: list[int] = field(default_factory=list, init=False)
    _unsent_logprobs: list[TokenLogprob] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        req = self.request
        if req.table is not None and req.thinking is not None:
            if is_lazy(req.table):
                raise InternalError("A thinking phase plans over the whole table (serving.py).")
            state = ReasoningState(req.table, req.thinking, req.budget_aware)
            self.constraint_state = self.thinking = state
        elif req.table is not None:
            self.constraint_state = ConstraintState(req.table, budget_aware=req.budget_aware)
        elif req.thinking is not None:
            self.thinking = ThinkingWatch(req.thinking.end_ids)
        stop = () if req.table is not None else req.params.stop
        self.text = TextStream(self.vocab.token_bytes, stop)
        if req.params.seed is not None:
            self.generator = torch.Generator().manual_seed(req.params.seed)

    @property
    def tokens_left(self) -> int:
        return self.request.params.max_tokens - self.generated

    def update(
        self, token: int, eos_ids: frozenset[int], logprob: TokenLogprob | None = None
    ) -> bool:
        """Take the sampled token (and its logprob, when asked for); emit text; return True
        when the sequence is done."""
        if self.cancelled:
            return True
        left = self.tokens_left
        self.generated += 1
        self.last_token = token
        c = self.constraint_state
        think = self.thinking
        was_thinking = think is not None and think.thinking
        if c is not None:
            c.advance(token, left if c.budget_aware else None)
            if c.finished:  # EOS, allowed only where the output is complete
                return self.finish("stop")
            self._take(token, logprob)
            self._push(token, was_thinking)
            if self.tokens_left <= 0:  # mid-output only when budget-unaware
                return self.finish(*out_of_budget(c))
            if c.must_stop(self.tokens_left):  # complete, and no token could continue it
                return self.finish("stop")
            return False
        if token in eos_ids:
            return self.finish("stop")
        if think is not None:
            think.advance(token)
        self._take(token, logprob)
        self._push(token, was_thinking)
        if self.text.stopped:
            return self.finish("stop")
        if self.tokens_left <= 0:
            return self.finish(*out_of_budget(None))
        return False

    def finish(self, reason: str, budget_cut: bool = False) -> bool:
        if not self.finished:
            self.finished = True
            think = self.thinking
            if think is not None and think.thinking:  # cut off while thinking
                self._emit(self._held.flush() + self.text.flush(), final=True, reasoning=True)
            else:
                self._emit(self.text.flush(), final=True)
            prompt = len(self.request.prompt_ids)
            thought = None if think is None else think.thinking_tokens
            event = FinishEvent(
                reason,
                prompt,
                self.generated,
                self.cached_tokens,
                budget_cut,
                reasoning_tokens=thought,
            )
            self._send(event)
        return True

    def _push(self, token: int, was_thinking: bool) -> None:
        """Decode the taken token and send its text: as thinking, holding back what may be
        the end marker (its text is left out), or as output."""
        text = self.text.push(token)
        think = self.thinking
        if not was_thinking or think is None:
            self._emit(text)
            return
        # Once the marker is complete its tokens go (final), its text does not.
        self._emit(self._held.push(text, think), final=not think.thinking, reasoning=True)

    def fail(self, error: Exception) -> None:
        if not self.finished:
            self.finished = True
            if not isinstance(error, GclmError):
                error = GclmError(str(error))
            self._send(ErrorEvent(error))

    def _take(self, token: int, logprob: TokenLogprob | None) -> None:
        self.output_ids.append(token)
        self._unsent_ids.append(token)
        if logprob is not None:
            self._unsent_logprobs.append(logprob)

    def _emit(self, text: str, final: bool = False, reasoning: bool = False) -> None:
        """Send `text` with the tokens taken since the last event. A token that completes
        no character waits for the next one; at the end, tokens left are sent anyway."""
        if text or (final and self._unsent_ids):
            ids, logprobs = tuple(self._unsent_ids), tuple(self._unsent_logprobs)
            self._unsent_ids.clear()
            self._unsent_logprobs.clear()
            self._send(TokenEvent(text, ids, logprobs, reasoning=reasoning))

    def _send(self, event: StreamEvent) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)
