"""A scripted Engine for the HTTP tests: no model, exact tokens, visible submits and cancels.

A script maps each GenerationRequest to its tokens: a `str` is one token's text delta (""
for a token that completes no character yet), an `Exception` becomes an ErrorEvent at that
point. The prompt "tokenizer" is UTF-8 bytes, so prompt_tokens is the prompt's byte length, and
cached_tokens is the longest prefix a prompt submitted before shared with it (a prefix cache).
When a request asks for logprobs, token i (from 0) gets `fake_logprob(i)` and its top list
is itself followed by "<alt1>", "<alt2>", ... one nat less likely each.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.whole.tables import CompiledTable, build_table
from gclm.errors import ConstraintError, EngineDeadError, QueueFullError
from gclm.server.engine.prepare import PreparesConstraints
from gclm.server.engine.protocol import (
    EngineStats,
    ErrorEvent,
    FinishEvent,
    GenerationRequest,
    StreamEvent,
    TokenEvent,
    TokenLogprob,
)

Script = Callable[[GenerationRequest], Sequence["str | Thought | Exception"]]

# Multi-byte UTF-8 on purpose: 2-byte ü/ß, 3-byte CJK, 4-byte emoji; "" is a token whose
# bytes do not yet complete a character.
FREE_TEXT = ("Grüße", ", ", "世界", "", " 👋")
JSON_TEXT = ('{"name": ', '"Zoë"', ', "age": ', "7}")
JSON_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}


def fake_logprob(i: int) -> float:
    return -0.25 * (i + 1)


def fake_token_logprob(i: int, text: str, top: int) -> TokenLogprob:
    lp = fake_logprob(i)
    alts = [TokenLogprob(f"<alt{j}>", f"<alt{j}>".encode(), lp - j) for j in range(1, top)]
    data = text.encode()
    return TokenLogprob(text, data, lp, (TokenLogprob(text, data, lp), *alts)[:top])


def default_script(request: GenerationRequest) -> Sequence[str | Exception]:
    return JSON_TEXT if request.constraint is not None else FREE_TEXT


def tiny_table(min_tokens: int = 3, vocab_size: int = 8, eos_token_id: int = 0) -> CompiledTable:
    """A chain of `min_tokens + 1` states: one token per step, only the last one accepting."""
    src = np.arange(min_tokens)
    accepting = np.zeros(min_tokens + 1, dtype=bool)
    accepting[-1] = True
    return build_table(
        vocab_size=vocab_size,
        eos_token_id=eos_token_id,
        initial=0,
        num_states=min_tokens + 1,
        accepting=accepting,
        src=src,
        tokens=src % (vocab_size - 1) + 1,  # never the EOS id
        dst=src + 1,
    )


@dataclass(frozen=True)
class FakePolicy:
    """Stands for the engine's BudgetPolicy of that name; the fake engine applies none."""

    name: str

    def adjust(self, logits: Any, state: Any, tokens_left: int, budget: int) -> None:
        raise AssertionError("the fake engine has no logits")


@dataclass(frozen=True)
class Thought:
    """A script item sent as thinking text (a TokenEvent with reasoning=True)."""

    text: str


@dataclass(eq=False)
class FakeHandle:
    request_id: str
    request: GenerationRequest
    cancelled: bool = False
    finished: bool = False
    cached_tokens: int = 0


class FakeEngine(PreparesConstraints):
    """Implements gclm.server.engine.protocol.Engine from a script, and its Prompts and
    ConstraintService itself (`prompts` and `constraints` are the engine).

    Args:
        script: tokens per request (default: multi-byte free text, or JSON when constrained).
        token_delay: seconds before each token, to keep streams open while a test acts.
        queue_size: running sequences allowed; one more makes submit raise QueueFullError.
        min_tokens: `min_tokens` of every compiled table.
    """

    model_id = "gclm-fake"
    # Its render_chat writes each message's role and content, nothing of tools; a test sets
    # True to see what a template that renders tools is given (`chats`, `template_kwargs`).
    renders_tools = False

    def __init__(
        self,
        script: Script = default_script,
        *,
        token_delay: float = 0.0,
        queue_size: int | None = None,
        retry_after: float = 2.5,
        min_tokens: int = 3,
        compile_seconds: float = 0.0,
    ) -> None:
        self.script = script
        self.compile_seconds = compile_seconds  # what each table says its compile took
        self.token_delay = token_delay
        self.queue_size = queue_size
        self.retry_after = retry_after
        self.min_tokens = min_tokens
        self.submits: list[GenerationRequest] = []
        self.cancels: list[str] = []  # request ids, in order, each once
        self.compiles: list[Constraint] = []
        self.template_kwargs: list[dict[str, Any]] = []  # render_chat's, per call
        self.chats: list[list[dict[str, Any]]] = []  # render_chat's messages, per call
        self.cache_hits = 0
        self.cache_misses = 0
        self._tables: dict[str, CompiledTable] = {}
        self._handles: list[FakeHandle] = []
        self._prompts: list[list[int]] = []  # prompts seen, for cached_tokens
        self._ids = itertools.count()
        self.started = False
        self.dead: str | None = None  # set by kill(): why the engine died
        self.prompts = self.constraints = self

    async def start(self) -> None:
        self.started = True

    def shutdown(self) -> None:
        self.kill("the engine was shut down")

    def kill(self, reason: str) -> None:
        """Die as a real engine does: every later health check and submit fails."""
        self.dead = reason

    def check_health(self) -> None:
        if self.dead is not None:
            raise EngineDeadError(self.dead)

    @property
    def running(self) -> list[FakeHandle]:
        return [h for h in self._handles if not (h.finished or h.cancelled)]

    async def compile(
        self, constraint: Constraint, *, first_mask: bool = False, deadline: float | None = None
    ) -> CompiledTable:
        await asyncio.sleep(0)  # a real compile yields to the loop
        self.compiles.append(constraint)
        key = constraint.key_material()
        if key in self._tables:
            self.cache_hits += 1
            return self._tables[key]
        self.cache_misses += 1
        _validate(constraint)
        table = tiny_table(self.min_tokens).with_info(compile_seconds=self.compile_seconds)
        self._tables[key] = table
        return table

    def budget_policy(self, name: str) -> FakePolicy | None:
        """A named marker the tests can see on submitted requests."""
        return FakePolicy(name) if name != "none" else None

    def encode_prompt(self, prompt: str) -> list[int]:
        return list(prompt.encode())

    def render_chat(self, messages: list[dict[str, Any]], **template_kwargs: Any) -> str:
        self.template_kwargs.append(template_kwargs)
        self.chats.append(messages)
        turns = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages)
        return turns + "<|assistant|>"

    def encode_chat(self, messages: list[dict[str, Any]], **template_kwargs: Any) -> list[int]:
        return self.encode_prompt(self.render_chat(messages, **template_kwargs))

    def submit(self, request: GenerationRequest) -> FakeHandle:
        self.check_health()
        if self.queue_size is not None and len(self.running) >= self.queue_size:
            raise QueueFullError(self.queue_size, retry_after=self.retry_after)
        self.submits.append(request)
        handle = FakeHandle(request.request_id or f"fake-{next(self._ids)}", request)
        handle.cached_tokens = self.cached_tokens(request.prompt_ids)
        self._handles.append(handle)
        return handle

    async def stream(self, handle: FakeHandle) -> AsyncIterator[StreamEvent]:
        request = handle.request
        emitted = thought = 0
        reason, cut = "stop", False
        try:
            for item in self.script(request):
                if emitted == request.params.max_tokens:
                    # As the real engines: a budget-aware constrained output is complete
                    # whenever it is cut, so "stop", with the cut reported apart.
                    complete = request.constraint is not None and request.constraint.budget_aware
                    reason, cut = ("stop" if complete else "length"), True
                    break
                await asyncio.sleep(self.token_delay)
                if handle.cancelled:
                    reason = "cancelled"
                    break
                if isinstance(item, Exception):
                    yield ErrorEvent(item)
                    return
                k = request.params.logprobs
                text = item.text if isinstance(item, Thought) else item
                logprobs = () if k is None else (fake_token_logprob(emitted, text, k),)
                emitted += 1
                thought += isinstance(item, Thought)
                yield TokenEvent(text, (emitted,), logprobs, reasoning=isinstance(item, Thought))
            reasoning = thought if request.thinking is not None else None
            yield FinishEvent(
                reason,
                len(request.prompt_ids),
                emitted,
                handle.cached_tokens,
                cut,
                reasoning_tokens=reasoning,
            )
        finally:
            handle.finished = True

    def cached_tokens(self, prompt: list[int]) -> int:
        """As a prefix cache: the longest prefix shared with an earlier prompt (all but the
        last token at most), then this prompt is remembered."""
        best = 0
        for seen in self._prompts:
            shared = next(
                (i for i, (a, b) in enumerate(zip(seen, prompt, strict=False)) if a != b),
                min(len(seen), len(prompt)),
            )
            best = max(best, min(shared, len(prompt) - 1))
        self._prompts.append(list(prompt))
        return best

    def cancel(self, handle: FakeHandle) -> None:
        if not handle.cancelled:
            handle.cancelled = True
            self.cancels.append(handle.request_id)

    def stats(self) -> EngineStats:
        return EngineStats(
            queue_depth=len(self.running),
            batch_size=min(len(self.running), 4),
            batch_slots=4,
            cache_hits=self.cache_hits,
            cache_misses=self.cache_misses,
        )

    async def wait_for_cancels(self, count: int, timeout: float = 2.0) -> list[str]:
        """The cancels, once at least `count` have arrived (a test helper)."""
        async with asyncio.timeout(timeout):
            while len(self.cancels) < count:
                await asyncio.sleep(0.005)
        return self.cancels


def _validate(constraint: Constraint) -> None:
    """The few checks the HTTP tests need; the real compiler checks everything."""
    if constraint.kind == "regex":
        try:
            re.compile(constraint.spec)
        except (re.error, OverflowError) as e:  # OverflowError: a{4294967296}
            raise ConstraintError(f"The regex does not compile: {e}. Fix the pattern.") from e
    if constraint.kind == "json_schema":
        schema = json.loads(constraint.spec)
        kind = schema.get("type") if isinstance(schema, dict) else None
        if kind is not None and kind not in JSON_TYPES:
            raise ConstraintError(
                f"JSON Schema type {kind!r} is not a JSON type; use one of {sorted(JSON_TYPES)}."
            )
