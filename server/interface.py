"""The narrow seam between HTTP and generation: submit, stream, cancel.

`server/app.py` talks only to an `Engine`. The real one (`server/engine.py`) batches
sequences on a model; tests use a scripted fake with the same methods.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from gclm.compiler.constraint import Constraint
from gclm.compiler.tables import CompiledTable
from gclm.masking.policy import BudgetPolicy


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()  # honoured for unconstrained requests only


@dataclass
class GenerationRequest:
    """One sequence to generate. `n > 1` is n requests sharing a prompt."""

    prompt_ids: list[int]
    params: SamplingParams
    table: CompiledTable | None = None  # None: unconstrained
    budget_aware: bool = True  # False: forward-only DFA mask (comparisons only)
    request_id: str = ""
    policy: BudgetPolicy | None = None  # reweights a budget-aware row's masked logits


@dataclass(frozen=True)
class TokenEvent:
    text: str  # decoded text delta, never a broken UTF-8 sequence
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class FinishEvent:
    finish_reason: str  # "stop" | "length" | "cancelled"
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class ErrorEvent:
    error: Exception


StreamEvent = TokenEvent | FinishEvent | ErrorEvent


class Handle(Protocol):
    request_id: str


class Engine(Protocol):
    model_id: str

    async def compile(self, constraint: Constraint) -> CompiledTable:
        """Compile (or fetch from cache) a constraint for this engine's tokenizer.
        Raises ConstraintError; never blocks the event loop."""
        ...

    def encode_prompt(self, prompt: str) -> list[int]: ...

    def render_chat(self, messages: list[dict[str, Any]]) -> str:
        """Apply the tokenizer's chat template, ending with the assistant turn's start."""
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
