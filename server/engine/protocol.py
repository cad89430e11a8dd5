"""The narrow seam between HTTP and generation: start, submit, stream, cancel, health, shutdown.

The HTTP layer (`server/app.py`, `server/openai/serving.py`) talks only to an `Engine`. The
real ones (`engine/transformers/engine.py`, `engine/vllm.py`) batch sequences on a model;
tests use a scripted fake with the same methods.
The engine owns its lifecycle: `server/launch.py` awaits `start()` on the serving loop and
calls `shutdown()` at exit, and `check_health()` is how the app learns that it died.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from gclm.compiler import CompiledTable, Constraint
from gclm.masking import MaskSource, mask_source, whole_table
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


@dataclass(frozen=True)
class BudgetAsk:
    """The budget a request asks for, and how a default is made when it asks for none."""

    requested: int | None  # the request's max_tokens; None: a default that fits
    param: str = "max_tokens"  # the parameter it came from, named by a 400
    floor: int = 256  # a default is at least this many tokens,
    factor: int = 4  # and at least this many times the constraint's minimum


class PrepareReport(Protocol):
    """What a request is told while its constraint is prepared (on the event loop)."""

    def compile_seconds(self, seconds: float) -> None:
        """The seconds of the compile this request is the first to receive (or of a
        compile stopped at its CPU limit)."""
        ...

    def first_masks(self) -> None:
        """The request starts on first masks while its constraint compiles."""
        ...


@dataclass(frozen=True)
class PreparedConstraint:
    """A request's constraint, ready for an engine: what its rows mask with, and how.

    Made in one place, the engine's ConstraintService.prepare (server/engine/prepare.py),
    which decides between first masks and the whole table and checks the budget once.
    """

    masks: MaskSource  # a whole table's MaskTable, or first masks (a LazyTable)
    # The whole table, where the request holds one: a thinking phase and a policy's plan
    # need it, and vLLM's processes mask with it. None on first masks.
    table: CompiledTable | None = None
    budget_aware: bool = True  # False: forward-only DFA mask (comparisons only)
    policy: BudgetPolicy | None = None  # reweights a budget-aware row's masked logits
    # What it was compiled from: vLLM's engine core compiles it again from this.
    compiled_from: Constraint | None = None

    @classmethod
    def of(
        cls,
        table: CompiledTable | MaskSource,
        *,
        budget_aware: bool = True,
        policy: BudgetPolicy | None = None,
        compiled_from: Constraint | None = None,
    ) -> PreparedConstraint:
        """A whole table's (or a mask source's) constraint as it stands, for code that
        compiled it itself (tests, benchmarks): no budget is checked here."""
        if table is None:  # an unconstrained request has no PreparedConstraint at all
            raise TypeError("PreparedConstraint.of needs a table; pass constraint=None instead.")
        return cls(mask_source(table), whole_table(table), budget_aware, policy, compiled_from)

    @property
    def source(self) -> CompiledTable | MaskSource:
        """What a sequence's state is made of: the whole table where there is one."""
        return self.table if self.table is not None else self.masks


@dataclass
class GenerationRequest:
    """One sequence to generate. `n > 1` is n requests sharing a prompt."""

    prompt_ids: list[int]
    params: SamplingParams
    constraint: PreparedConstraint | None = None  # None: unconstrained
    request_id: str = ""
    # A reasoning phase before the output (masking/reasoning.py); None: no thinking. With a
    # constraint, its `table` is the whole table.
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
    # The prompt's leading tokens whose KV the engine reused instead of computing them.
    cached_tokens: int = 0
    # The budget ended the output where it could have gone on (no EOS, and the constraint,
    # if any, still open). A constrained output cut so is complete and reports "stop"; the
    # HTTP layer reports "length" when that output is free text (a tool_choice "auto" answer).
    budget_cut: bool = False
    reasoning_tokens: int | None = None  # of completion_tokens; None: not a thinking request


@dataclass(frozen=True)
class ErrorEvent:
    error: Exception


StreamEvent = TokenEvent | FinishEvent | ErrorEvent


@dataclass(frozen=True)
class EngineStats:
    """What /metrics reads from an engine at each scrape (server/http/metrics.py)."""

    queue_depth: int  # choices waiting for a batch slot
    batch_size: int  # choices in the running batch
    batch_slots: int = 0  # the most choices a batch holds
    cache_hits: int = 0  # constraints served without compiling (memory, disk, failures)
    cache_misses: int = 0  # constraints compiled
    # The table cache's and compile pool's gauges (TableCache.gauges, CompilerPool.gauges)
    # and the engine's own counters, exported as gclm_engine_<name> when not known.
    gauges: Mapping[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, float]:
        """Every number by its name: the fields, then the gauges."""
        named = {
            "queue_depth": self.queue_depth,
            "batch_size": self.batch_size,
            "batch_slots": self.batch_slots,
            "cache_hits": self.cache_hits,
            "cache_misses": self.cache_misses,
        }
        return {name: float(value) for name, value in {**named, **self.gauges}.items()}


class Handle(Protocol):
    request_id: str


# An engine's own handle type: what its submit returns is what its stream and cancel take.
HandleT = TypeVar("HandleT", bound=Handle)


class Prompts(Protocol):
    """The served model's tokenizer and chat template: text and messages to prompt ids."""

    def encode_prompt(self, prompt: str) -> list[int]: ...

    def render_chat(self, messages: list[dict[str, Any]], **template_kwargs: Any) -> str:
        """Apply the tokenizer's chat template, ending with the assistant turn's start;
        `template_kwargs` go to the template (`enable_thinking`)."""
        ...

    def encode_chat(self, messages: list[dict[str, Any]], **template_kwargs: Any) -> list[int]:
        """The prompt ids of `messages` (server/engine/chat_template.py): control-token text
        inside a message is plain text, only the template's own control tokens are special."""
        ...

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template writes tools, calls and tool results itself
        (chat_template.renders_tools); otherwise gclm writes them into the messages."""
        ...


class ConstraintService(Protocol):
    """The engine's tables and budget policies, for its vocabulary
    (server/engine/constraints.py)."""

    async def prepare(
        self,
        constraint: Constraint,
        budget: BudgetAsk,
        *,
        budget_aware: bool = True,
        policy: str = "none",
        thinking: ThinkingSpec | None = None,
        deadline: float | None = None,
        report: PrepareReport | None = None,
    ) -> tuple[PreparedConstraint, int]:
        """The constraint ready to mask, and the request's max_tokens
        (server/engine/prepare.py). Raises ConstraintError, BudgetTooSmallError, and past
        `deadline` CompilerBusyError (429) while the compile goes on; never blocks the
        event loop."""
        ...


class Engine(Protocol[HandleT]):
    """Seven methods; what a request meets before generation is in `prompts` and
    `constraints`."""

    model_id: str

    @property
    def prompts(self) -> Prompts:
        """The served model's tokenizer and chat template."""
        ...

    @property
    def constraints(self) -> ConstraintService:
        """The engine's tables and budget policies."""
        ...

    async def start(self) -> None:
        """Make the engine ready to serve; awaited once on the serving event loop, before
        the first request."""
        ...

    def shutdown(self) -> None:
        """Stop serving and free the engine's threads and processes. Idempotent."""
        ...

    def check_health(self) -> None:
        """Return when the engine serves; raise EngineDeadError (503), saying why, once it
        has died (its thread or its engine core gone). Cheap: GET /health calls it."""
        ...

    def submit(self, request: GenerationRequest) -> HandleT:
        """Queue a request. Raises QueueFullError when the queue is full."""
        ...

    def stream(self, handle: HandleT) -> AsyncIterator[StreamEvent]:
        """Events for one request, ending with a FinishEvent or an ErrorEvent."""
        ...

    def cancel(self, handle: HandleT) -> None:
        """Free the request's slot now (client gone). Idempotent."""
        ...

    def stats(self) -> EngineStats:
        """What /metrics exports: queue and batch, table cache and compile pool."""
        ...
