"""The narrow seam between HTTP and generation: submit, stream, cancel.

`server/app.py` talks only to an `Engine`. The real ones (`engine/transformers/engine.py`,
`engine/vllm.py`) batch sequences on a model; tests use a scripted fake with the same methods.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from gclm.compiler.constraint import Constraint
from gclm.compiler.tables import CompiledTable
from gclm.masking.policy import BudgetPolicy
from gclm.masking.reasoning import ThinkingSpec


@dataclass(frozen=True)
class SamplingParams:
    """How one sequence is sampled.

    Penalties and `logit_bias` change the logits BEFORE the constraint mask, so they can
    steer a constrained output but never make it invalid. `logprobs` are read AFTER the mask
    (and the penalties), so a token the constraint forbids never appears among them.
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()  # honoured for unconstrained requests only
    presence_penalty: float = 0.0  # OpenAI: minus this once for every token already output
    frequency_penalty: float = 0.0  # OpenAI: minus this times the token's output count
    repetition_penalty: float = 1.0  # vLLM/HF: seen tokens (prompt or output) divided by it
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    logprobs: int | None = None  # None: none; k: the sampled token's and the k most likely

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}.")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}.")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be None or >= 0, got {self.logprobs}.")

    @property
    def penalized(self) -> bool:
        """Whether any penalty or bias changes this sequence's logits."""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
        )


@dataclass
class GenerationRequest:
    """One sequence to generate. `n > 1` is n requests sharing a prompt."""

    prompt_ids: list[int]
    params: SamplingParams
    table: CompiledTable | None = None  # None: unconstrained
    budget_aware: bool = True  # False: forward-only DFA mask (comparisons only)
    request_id: str = ""
    policy: BudgetPolicy | None = None  # reweights a budget-aware row's masked logits
    # A reasoning phase before the output (masking/reasoning.py); None: no thinking.
    thinking: ThinkingSpec | None = None


@dataclass(frozen=True)
class TokenLogprob:
    """One output token's log-probability, and the `top` most likely tokens at its step.

    `token` is the token's text ("bytes:\\xe4" style when its bytes are not whole UTF-8,
    the tokenizer's name for a special token); `bytes` is None for a token without bytes.
    """

    token: str
    bytes: bytes | None
    logprob: float
    top: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class TokenEvent:
    text: str  # decoded text delta, never a broken UTF-8 sequence
    token_ids: tuple[int, ...]  # the tokens since the previous event (EOS excluded)
    # One per token in token_ids when the request asked for logprobs, else empty.
    logprobs: tuple[TokenLogprob, ...] = ()
    # Thinking text (the end marker left out), before the answer, of a thinking request.
    reasoning: bool = False


@dataclass(frozen=True)
class FinishEvent:
    finish_reason: str  # "stop" | "length" | "cancelled"
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int | None = None  # of completion_tokens; None: not a thinking request


@dataclass(frozen=True)
class ErrorEvent:
    error: Exception


StreamEvent = TokenEvent | FinishEvent | ErrorEvent


async def until_done(events: asyncio.Queue[StreamEvent]) -> AsyncIterator[StreamEvent]:
    """A request's events from its queue, ending with its FinishEvent or ErrorEvent: the
    `stream` of both engines, whose handles each hold such a queue."""
    while True:
        event = await events.get()
        yield event
        if isinstance(event, FinishEvent | ErrorEvent):
            return


class Handle(Protocol):
    request_id: str


class Engine(Protocol):
    model_id: str

    async def compile(self, constraint: Constraint) -> CompiledTable:
        """Compile (or fetch from cache) a constraint for this engine's tokenizer.
        Raises ConstraintError; never blocks the event loop."""
        ...

    def encode_prompt(self, prompt: str) -> list[int]: ...

    def render_chat(self, messages: list[dict[str, Any]], **template_kwargs: Any) -> str:
        """Apply the tokenizer's chat template, ending with the assistant turn's start;
        `template_kwargs` go to the template (`enable_thinking`)."""
        ...

    def budget_policy(self, name: str) -> BudgetPolicy | None:
        """The BudgetPolicy called `name` (masking.graceful.POLICY_NAMES) for this engine's
        vocabulary; None for "none"."""
        ...

    def submit(self, request: GenerationRequest) -> Handle:
        """Queue a request. Raises QueueFullError when the queue is full."""
        ...

    def stream(self, handle: Handle) -> AsyncIterator[StreamEvent]:
        """Events for one request, ending with a FinishEvent or an ErrorEvent."""
        ...

    def cancel(self, handle: Handle) -> None:
        """Free the request's slot now (client gone). Idempotent."""
        ...

    def stats(self) -> dict[str, float]:
        """Gauges for /metrics: queue_depth, batch_size."""
        ...
