"""The serving pipeline every generating endpoint shares (the APIs' routers: chat/router.py,
completions/router.py, responses/router.py).

One generation request flows: parse and refuse what gclm cannot honour (the API's
protocol.py) -> constraint -> `engine.compile` -> budget check -> one `engine.submit` per
choice -> events merged per request (streaming) -> JSON body or Server-Sent Events (the API's
Renderer, render.py). The three generating endpoints share that path; they differ only in their
request model and their renderer. A client that disconnects, streaming or not, has its
sequences cancelled at once.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextlib import aclosing

from fastapi import Request, Response

from gclm.compiler.tables import CompiledTable
from gclm.errors import (
    CompileLimitError,
    ConstraintError,
    InvalidRequestError,
    ModelNotFoundError,
)
from gclm.masking import check_budget
from gclm.masking.reasoning import ThinkingSpec
from gclm.server.engine.protocol import (
    Engine,
    FinishEvent,
    GenerationRequest,
    Handle,
    TokenEvent,
)
from gclm.server.http.errors import CLIENT_CLOSED, as_gclm_error
from gclm.server.http.keys import CompileCharges, charge
from gclm.server.http.metrics import Metrics
from gclm.server.http.streaming import (
    Choices,
    ClientDisconnected,
    EventStreamResponse,
    until_disconnected,
)
from gclm.server.openai.constraint_spec import ConstraintSpec, constraint_spec, with_param
from gclm.server.openai.protocol import GenerationBody
from gclm.server.openai.reasoning import (
    ReasoningParser,
    ThinkingControls,
    with_reasoning_tokens,
)
from gclm.server.openai.render import ChoiceOutput, Renderer, Usage
from gclm.server.settings import ServerSettings


def serving_of(request: Request) -> Serving:
    """The app's `Serving` (create_app puts it in `app.state.serving`)."""
    serving: Serving = request.app.state.serving
    return serving


class Serving:
    """What the endpoints share: the engine, the settings, the metrics, the served model's
    thinking markers, and the one generation path (`generate`)."""

    def __init__(
        self,
        engine: Engine,
        settings: ServerSettings,
        metrics: Metrics,
        reasoning: ReasoningParser | None = None,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self.reasoning = reasoning
        self.compile_charges = CompileCharges()
        self.started = int(time.time())  # the model cards' `created`

    def thinks(self, body: GenerationBody) -> bool:
        """Whether the request thinks before its output (a reasoning model's chat)."""
        return (
            self.reasoning is not None
            and isinstance(body, ThinkingControls)
            and body.wants_thinking()
        )

    def check_model(self, body: GenerationBody) -> None:
        if body.model is not None and body.model != self.engine.model_id:
            raise ModelNotFoundError(body.model, self.engine.model_id)

    async def generate(
        self,
        request: Request,
        body: GenerationBody,
        prompts: list[list[int]],
        renderer: Renderer,
    ) -> Response:
        """Compile, check the budget, submit every choice, and answer (JSON or SSE).

        Choices are numbered prompt-major: choice `p * n + i` is sample `i` of prompt `p`.
        """
        self.engine.check_health()  # a dead engine: 503 now, not after compiling
        self.check_admissible(body, len(prompts))
        spec = constraint_spec(body)
        table = await self.compile(spec, request) if spec is not None else None
        budget_aware = spec.budget_aware if spec is not None else True
        parser = self.reasoning if self.thinks(body) else None
        marker = ThinkingSpec(parser.end_ids) if parser is not None else None
        max_tokens = self.budget(body, table, budget_aware, marker)
        thinking = None
        if parser is not None and isinstance(body, ThinkingControls):
            thinking = parser.thinking(body, table, max_tokens)
        policy = self.engine.budget_policy(spec.budget_policy) if spec and budget_aware else None
        requests = [
            GenerationRequest(
                prompt_ids=prompt,
                params=body.sampling_params(max_tokens, sample=i),
                table=table,
                budget_aware=budget_aware,
                policy=policy,
                thinking=thinking,
                request_id=f"{renderer.id}-{p * body.n + i}",
            )
            for p, prompt in enumerate(prompts)
            for i in range(body.n)
        ]
        sequences = Choices(self.engine, self.submit_all(requests))
        prompt_tokens = sum(len(p) for p in prompts)
        self.metrics.prompt_tokens.inc(prompt_tokens)
        if body.stream:
            events = self.stream(request, sequences, renderer, prompt_tokens, body)
            return EventStreamResponse(
                events, on_close=sequences.close, on_disconnect=self.metrics.disconnects.inc
            )
        with_logprobs = body.logprobs_count is not None
        try:
            outputs, completion_tokens, cached_tokens = await until_disconnected(
                request.receive, self.collect(sequences, renderer, with_logprobs, body.n)
            )
        except ClientDisconnected:
            self.metrics.disconnects.inc()
            return Response(status_code=CLIENT_CLOSED)
        finally:
            sequences.close()
        usage = Usage.of(prompt_tokens, completion_tokens, cached_tokens)
        charge(request, tokens=usage.total_tokens)
        if thinking is not None:
            usage = with_reasoning_tokens(usage, sum(out.reasoning_tokens for out in outputs))
        final = renderer.final(outputs, usage)
        return Response(final.model_dump_json(), media_type="application/json")

    def check_admissible(self, body: GenerationBody, prompts: int) -> None:
        """A 400 for a request that no amount of waiting lets in: more choices (n x prompts)
        than the whole queue holds. A 429 would have its client retry forever."""
        choices = prompts * body.n
        if choices > self.settings.queue_size:
            raise InvalidRequestError(
                f"This request asks for {choices} choices ({prompts} prompt(s) x n={body.n}), "
                f"more than the server queues at once ({self.settings.queue_size}). Lower n or "
                "send fewer prompts per request, or start the server with a larger --queue-size.",
                param="n",
                code="too_many_choices",
            )

    async def compile(self, spec: ConstraintSpec, request: Request) -> CompiledTable:
        """The compiled table; a ConstraintError names the parameter the constraint came from.

        The compile time goes to the API key of the first request that gets the table, or
        the error of a compile stopped at its CPU limit (a cached one costs nothing)."""
        started = time.perf_counter()
        try:
            table = await self.engine.compile(spec.constraint)
        except ConstraintError as e:
            if isinstance(e, CompileLimitError) and self.compile_charges.first_time(e):
                charge(request, compile_seconds=e.compile_seconds)
            raise with_param(e, spec.param) from None
        finally:
            self.metrics.compile_seconds.observe(time.perf_counter() - started)
        if self.compile_charges.first_time(table):
            charge(request, compile_seconds=table.compile_seconds)
        return table

    def budget(
        self,
        body: GenerationBody,
        table: CompiledTable | None,
        budget_aware: bool,
        thinking: ThinkingSpec | None = None,
    ) -> int:
        """max_tokens for every choice: the user's, or a default that fits the constraint
        (after the end of thinking, for a request that thinks first).

        Raises BudgetTooSmallError when a budget-aware constraint cannot finish within the
        user's budget. budget_aware=False skips the check: that mode exists to show what
        happens when the budget runs out.
        """
        requested, param = body.budget_request()
        s = self.settings
        if requested is None:
            if table is None:
                return s.default_max_tokens
            need = table.min_tokens if thinking is None else thinking.min_tokens(table)
            return max(s.constrained_max_tokens_floor, s.constrained_max_tokens_factor * need)
        if table is not None and budget_aware:
            check_budget(table, requested, param, thinking=thinking)
        return requested

    def submit_all(self, requests: list[GenerationRequest]) -> list[Handle]:
        """Submit every choice, or none: on QueueFullError the ones queued are cancelled."""
        handles: list[Handle] = []
        try:
            for generation_request in requests:
                handles.append(self.engine.submit(generation_request))
        except BaseException:
            for handle in handles:
                self.engine.cancel(handle)
            raise
        return handles

    async def collect(
        self, sequences: Choices, renderer: Renderer, with_logprobs: bool, n: int
    ) -> tuple[list[ChoiceOutput], int, int]:
        """Every choice's output, the tokens generated in all, and the prompt tokens the
        engine reused (counted once per prompt: its n choices share it).

        Raises the first error any choice reports (the others are then cancelled).
        """
        n = len(sequences.handles)
        pieces: list[list[str]] = [[] for _ in range(n)]
        thoughts: list[list[str]] = [[] for _ in range(n)]
        outputs = [ChoiceOutput(logprobs=[] if with_logprobs else None) for _ in range(n)]
        completion_tokens = cached_tokens = 0
        async with aclosing(sequences.events()) as events:
            async for index, event in events:
                if isinstance(event, TokenEvent):
                    (thoughts if event.reasoning else pieces)[index].append(event.text)
                    if with_logprobs:
                        outputs[index].logprobs.extend(event.logprobs)  # type: ignore[union-attr]
                elif isinstance(event, FinishEvent):
                    outputs[index].finish_reason = renderer.finish_reason(event)
                    outputs[index].reasoning_tokens = event.reasoning_tokens or 0
                    completion_tokens += event.completion_tokens
                    cached_tokens += event.cached_tokens if index % n == 0 else 0
                    self.metrics.completion_tokens.inc(event.completion_tokens)
                else:
                    raise as_gclm_error(event.error)
        for out, texts, thought in zip(outputs, pieces, thoughts, strict=True):
            out.text = "".join(texts)
            out.reasoning = "".join(thought)
        return outputs, completion_tokens, cached_tokens

    async def stream(
        self,
        request: Request,
        sequences: Choices,
        renderer: Renderer,
        prompt_tokens: int,
        body: GenerationBody,
    ) -> AsyncGenerator[bytes, None]:
        """SSE body: opening chunks, deltas and finishes as they come, closing (usage), and
        the renderer's end marker ([DONE]).

        An error from any choice ends the stream with the renderer's failure events.
        """
        frame = renderer.frame
        for chunk in renderer.opening(len(sequences.handles)):
            yield frame(chunk)
        with_logprobs = body.logprobs_count is not None
        completion_tokens = cached_tokens = 0
        reasoning_tokens: int | None = None
        async with aclosing(sequences.events()) as events:
            async for index, event in events:
                if isinstance(event, TokenEvent) and event.reasoning:
                    chunk = renderer.reasoning_delta(index, event.text)
                    if chunk is not None:
                        yield frame(chunk)
                elif isinstance(event, TokenEvent):
                    # A token that completes no character yet sends nothing (its logprob
                    # goes with the text that completes it).
                    if event.text or (with_logprobs and event.logprobs):
                        logprobs = event.logprobs if with_logprobs else None
                        for chunk in renderer.deltas(index, event.text, logprobs):
                            yield frame(chunk)
                elif isinstance(event, FinishEvent):
                    completion_tokens += event.completion_tokens
                    cached_tokens += event.cached_tokens if index % body.n == 0 else 0
                    if event.reasoning_tokens is not None:
                        reasoning_tokens = (reasoning_tokens or 0) + event.reasoning_tokens
                    self.metrics.completion_tokens.inc(event.completion_tokens)
                    for chunk in renderer.finish(index, renderer.finish_reason(event)):
                        yield frame(chunk)
                else:
                    error = as_gclm_error(event.error)
                    self.metrics.reject(error.code or error.error_type)
                    for line in renderer.failure(error):
                        yield line
                    return
        usage = Usage.of(prompt_tokens, completion_tokens, cached_tokens)
        charge(request, tokens=usage.total_tokens)
        usage = with_reasoning_tokens(usage, reasoning_tokens)
        for chunk in renderer.closing(usage, body.include_usage):
            yield frame(chunk)
        if renderer.done is not None:
            yield renderer.done
