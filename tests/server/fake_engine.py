"""A scripted Engine for the HTTP tests: no model, exact tokens, visible submits and cancels.

A script maps each GenerationRequest to its tokens: a `str` is one token's text delta (""
for a token that completes no character yet), an `Exception` becomes an ErrorEvent at that
point. The prompt "tokenizer" is UTF-8 bytes, so prompt_tokens is the prompt's byte length.
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

from gclm.compiler.constraint import Constraint
from gclm.compiler.tables import CompiledTable, build_table
from gclm.errors import ConstraintError, QueueFullError
from gclm.server.engine.protocol import (
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
    return JSON_TEXT if request.table is not None else FREE_TEXT


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


class FakeEngine:
    """Implements gclm.server.engine.protocol.Engine from a script.

    Args:
        script: tokens per request (default: multi-byte free text, or JSON when constrained).
        token_delay: seconds before each token, to keep streams open while a test acts.
        queue_size: running sequences allowed; one more makes submit raise QueueFullError.
        min_tokens: `min_tokens` of every compiled table.
    """

    model_id = "gclm-fake"

    def __init__(
        self,
        script: Script = default_script,
        *,
        token_delay: float = 0.0,
        queue_size: int | None = None,
        retry_after: float = 2.5,
        min_tokens: int = 3,
    ) -> None:
        self.script = script
        self.token_delay = token_delay
        self.queue_size = queue_size
        self.retry_after = retry_after
        self.min_tokens = min_tokens
        self.submits: list[GenerationRequest] = []
        self.cancels: list[str] = []  # request ids, in order, each once
        self.compiles: list[Constraint] = []
        self.template_kwargs: list[dict[str, Any]] = []  # render_chat's, per call
        self.cache_hits = 0
        self.cache_misses = 0
        self._tables: dict[str, CompiledTable] = {}
        self._handles: list[FakeHandle] = []
        self._ids = itertools.count()

    @property
    def running(self) -> list[FakeHandle]:
        return [h for h in self._handles if not (h.finished or h.cancelled)]

    async def compile(self, constraint: Constraint) -> CompiledTable:
        await asyncio.sleep(0)  # a real compile yields to the loop
        self.compiles.append(constraint)
        key = constraint.key_material()
        if key in self._tables:
            self.cache_hits += 1
            return self._tables[key]
        self.cache_misses += 1
        _validate(constraint)
        table = self._tables[key] = tiny_table(self.min_tokens)
        return table

    def budget_policy(self, name: str) -> FakePolicy | None:
        """A named marker the tests can see on submitted requests."""
        return FakePolicy(name) if name != "none" else None

    def encode_prompt(self, prompt: str) -> list[int]:
        return list(prompt.encode())

    def render_chat(self, messages: list[dict[str, Any]], **template_kwargs: Any) -> str:
        self.template_kwargs.append(template_kwargs)
        turns = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages)
        return turns + "<|assistant|>"

    def submit(self, request: GenerationRequest) -> FakeHandle:
        if self.queue_size is not None and len(self.running) >= self.queue_size:
            raise QueueFullError(self.queue_size, retry_after=self.retry_after)
        self.submits.append(request)
        handle = FakeHandle(request.request_id or f"fake-{next(self._ids)}", request)
        self._handles.append(handle)
        return handle

    async def stream(self, handle: FakeHandle) -> AsyncIterator[StreamEvent]:
        request = handle.request
        emitted = thought = 0
        reason = "stop"
        try:
            for item in self.script(request):
                if emitted == request.params.max_tokens:
                    reason = "length"
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
            yield FinishEvent(reason, len(request.prompt_ids), emitted, reasoning)
        finally:
            handle.finished = True

    def cancel(self, handle: FakeHandle) -> None:
        if not handle.cancelled:
            handle.cancelled = True
            self.cancels.append(handle.request_id)

    def stats(self) -> dict[str, float]:
        return {
            "queue_depth": float(len(self.running)),
            "batch_size": float(min(len(self.running), 4)),
            "cache_hits": float(self.cache_hits),
            "cache_misses": float(self.cache_misses),
        }

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
        except re.error as e:
            raise ConstraintError(f"The regex does not compile: {e}. Fix the pattern.") from e
    if constraint.kind == "json_schema":
        schema = json.loads(constraint.spec)
        kind = schema.get("type") if isinstance(schema, dict) else None
        if kind is not None and kind not in JSON_TYPES:
            raise ConstraintError(
                f"JSON Schema type {kind!r} is not a JSON type; use one of {sorted(JSON_TYPES)}."
            )
