"""One request's output, for either engine: sampled token ids in, the HTTP layer's events out.

An engine hands each request's sampled tokens to its `OutputTracker` (`take`), which advances
the request's ConstraintState or ReasoningState (or a ThinkingWatch, without a constraint),
decodes the text (detokenize.py; stop strings honoured), splits a thinking request's text
into thinking and answer (thinking.py), leaves the token that ended the output (EOS, a stop
token) out of it, and sends `TokenEvent`s; `finish` sends the one `FinishEvent`.

The engines differ in three small inputs, not in the rules:
- which tokens end the output: `eos_ids`, given with the tokens (the transformers engine's
  EOS ids; on vLLM the stop token it names, in the output it stopped in);
- the text: the transformers engine has none and the tracker decodes; vLLM detokenizes and
  its `text` is sent as it is, except for a thinking request, whose text is split here by
  token;
- who decides the end: `take` returns the reason the output ended (the transformers engine
  finishes with it); vLLM decides for itself and the tracker is told its reason.

The finish rule is one: "length" is the budget running out, reported as `out_of_budget`
says ("stop" for a complete constrained output, and whether the budget cut it).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence

from gclm.errors import GclmError, InternalError
from gclm.masking import ConstraintState
from gclm.masking.reasoning import ReasoningState, ThinkingWatch
from gclm.server.engine.detokenize import TextStream
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


class OutputTracker:
    """A request's output so far: its constraint and thinking state, its text, its counts.

    Args:
        request: the request (its table, thinking spec, budget and stop strings).
        token_bytes: each token id's bytes (the vocabulary's), for decoding.
        send: where the events go, in order (the engine's queue for the request).

    Budget: `tokens_left` counts the token about to be sampled; every sampled token counts,
    the one that ends the output included. A constrained output ignores stop strings:
    cutting it short would break its validity.
    """

    def __init__(
        self,
        request: GenerationRequest,
        token_bytes: Sequence[bytes | None],
        send: Callable[[StreamEvent], None],
    ) -> None:
        self.request = request
        self.send = send
        self.constraint_state: ConstraintState | None = None
        # A thinking request's phase: its ReasoningState, or a ThinkingWatch without a constraint.
        self.thinking: ReasoningState | ThinkingWatch | None = None
        constraint, thinking = request.constraint, request.thinking
        if constraint is not None and thinking is not None:
            if constraint.table is None:
                raise InternalError("A thinking phase plans over the whole table (prepare.py).")
            state = ReasoningState(constraint.table, thinking, constraint.budget_aware)
            self.constraint_state = self.thinking = state
        elif constraint is not None:
            self.constraint_state = ConstraintState(
                constraint.source, budget_aware=constraint.budget_aware
            )
        elif thinking is not None:
            self.thinking = ThinkingWatch(thinking.end_ids)
        self.text = TextStream(token_bytes, () if constraint is not None else request.params.stop)
        self.generated = 0  # tokens sampled, the one that ended the output included
        self.output_ids: list[int] = []  # the output's tokens (EOS and stop tokens left out)
        self.cached_tokens = 0  # prompt tokens whose KV the engine reused
        self.finished = False
        # The text of the thinking's last tokens that may be the start of its end marker.
        self._held = MarkerHold()
        # Taken but not yet sent: a token that completes no character waits for the next one.
        self._unsent_ids: list[int] = []
        self._unsent_logprobs: list[TokenLogprob] = []
        self._events: list[TokenEvent] = []  # this `take`'s events, sent together

    @property
    def tokens_left(self) -> int:
        return self.request.params.max_tokens - self.generated

    def take(
        self,
        tokens: Sequence[int],
        logprobs: Sequence[TokenLogprob] = (),
        *,
        eos_ids: Collection[int] = (),
        text: str | None = None,
    ) -> str | None:
        """Take the tokens sampled since the last call, in order, and send their events:
        one per run of thinking or answer text.

        Args:
            tokens: the sampled ids.
            logprobs: one per token of the output (not for the token that ended it) when the
                request asked for them, else empty.
            eos_ids: the ids that end an unconstrained output without being part of it (a
                constrained one ends where its state takes the table's EOS).
            text: the engine's own text of `tokens`, sent as it is; None (or a thinking
                request, whose text is split by token) decodes it here.

        Returns:
            Why the output has ended, or None while it goes on: "stop" (EOS, a stop string,
            or a complete constrained output that nothing could continue) or "length" (the
            budget ran out; `finish` reports it by `out_of_budget`'s rule).

        Raises:
            InternalError: a token the constraint does not allow (the mask was not applied).
        """
        decode = text is None or self.thinking is not None
        lps = iter(logprobs)
        ended = None
        for token in tokens:
            ended = self._take_one(token, lps, eos_ids, decode)
        if not decode:
            if text or self._unsent_logprobs:
                self._emit(text or "", final=True)
            self._unsent_ids.clear()  # no text and no logprobs: nothing to send
        self._send_events()
        return ended

    def finish(self, reason: str) -> None:
        """Send the held text and the FinishEvent, once. `reason`: "stop", "cancelled", or
        "length" (the budget ran out: "stop" where the constrained output is complete,
        with the budget cut set unless the constraint allowed nothing more)."""
        if self.finished:
            return
        self.finished = True
        budget_cut = False
        if reason == "length":
            reason, budget_cut = out_of_budget(self.constraint_state)
        think = self.thinking
        if think is not None and think.thinking:  # cut off while thinking
            self._emit(self._held.flush() + self.text.flush(), final=True, reasoning=True)
        else:
            self._emit(self.text.flush(), final=True)
        self._send_events()
        self.send(
            FinishEvent(
                reason,
                len(self.request.prompt_ids),
                self.generated,
                self.cached_tokens,
                budget_cut,
                reasoning_tokens=None if think is None else think.thinking_tokens,
            )
        )

    def fail(self, error: Exception) -> None:
        """Send `error` (as a GclmError) instead of a FinishEvent, once."""
        if not self.finished:
            self.finished = True
            self.send(ErrorEvent(error if isinstance(error, GclmError) else GclmError(str(error))))

    def _take_one(
        self,
        token: int,
        logprobs: Iterator[TokenLogprob],
        eos_ids: Collection[int],
        decode: bool,
    ) -> str | None:
        left = self.tokens_left
        self.generated += 1
        c, think = self.constraint_state, self.thinking
        was_thinking = think is not None and think.thinking
        if c is not None:
            c.advance(token, left if c.budget_aware else None)
            if c.finished:  # EOS, allowed only where the output is complete
                return "stop"
        elif token in eos_ids:
            return "stop"
        elif think is not None:
            think.advance(token)
        self.output_ids.append(token)
        self._unsent_ids.append(token)
        logprob = next(logprobs, None)
        if logprob is not None:
            self._unsent_logprobs.append(logprob)
        if decode:
            self._push(token, was_thinking)
        if self.text.stopped:
            return "stop"
        if self.tokens_left <= 0:  # mid-output only when budget-unaware
            return "length"
        if c is not None and c.must_stop(self.tokens_left):  # complete, nothing can follow
            return "stop"
        return None

    def _push(self, token: int, was_thinking: bool) -> None:
        """Decode the taken token and emit its text: as thinking, holding back what may be
        the end marker (its text is left out), or as output."""
        text = self.text.push(token)
        think = self.thinking
        if not was_thinking or think is None:
            self._emit(text)
            return
        # Once the marker is complete its tokens go (final), its text does not.
        self._emit(self._held.push(text, think), final=not think.thinking, reasoning=True)

    def _emit(self, text: str, final: bool = False, reasoning: bool = False) -> None:
        """Emit `text` with the tokens taken since the last event. A token that completes
        no character waits for the next one; `final` sends the tokens waiting anyway. An
        event of the same kind as the one before it in this `take` joins it."""
        if not (text or (final and self._unsent_ids)):
            return
        ids, logprobs = tuple(self._unsent_ids), tuple(self._unsent_logprobs)
        self._unsent_ids.clear()
        self._unsent_logprobs.clear()
        events = self._events
        if events and events[-1].reasoning == reasoning:
            last = events[-1]
            ids, logprobs = last.token_ids + ids, last.logprobs + logprobs
            events[-1] = TokenEvent(last.text + text, ids, logprobs, reasoning=reasoning)
        else:
            events.append(TokenEvent(text, ids, logprobs, reasoning=reasoning))

    def _send_events(self) -> None:
        for event in self._events:
            self.send(event)
        self._events.clear()
