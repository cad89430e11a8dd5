"""The serving pipeline every generating endpoint shares (the APIs' routers: chat/router.py,
completions/router.py, responses/router.py).

One generation request flows: parse and refuse what gclm cannot honour (the API's
protocol.py) -> `Serving.to_plan`: a frozen `GenerationPlan` (the constraint compiled, the
budget checked, every choice's engine request, what the output holds: output.py) -> one
`engine.submit` per choice -> one `EventFold` over the choices' events, for a streamed answer
(Server-Sent Events, as they come) and a collected one (one JSON body) alike, so their usage
and finish reasons cannot drift -> the API's Renderer (render.py). The three generating
endpoints differ only in their request model, their prompt and their renderer. A client that
disconnects, streaming or not, has its sequences cancelled at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, replace

from fastapi import Request, Response
from pydantic import BaseModel

from gclm.compiler import OutOfTime, work_deadline
from gclm.errors import (
    CompileLimitError,
    ConstraintError,
    GclmError,
    InvalidRequestError,
    ModelNotFoundError,
)
from gclm.masking.reasoning import ThinkingSpec
from gclm.server.engine.protocol import (
    BudgetAsk,
    Engine,
    FinishEvent,
    GenerationRequest,
    Handle,
    PreparedConstraint,
    StreamEvent,
    TokenEvent,
    TokenLogprob,
)
from gclm.server.http.errors import CLIENT_CLOSED, as_gclm_error
from gclm.server.http.keys import charge
from gclm.server.http.metrics import Metrics
from gclm.server.http.streaming import (
    Choices,
    ClientDisconnected,
    EventStreamResponse,
    until_disconnected,
)
from gclm.server.openai.constraint_spec import ConstraintSpec, constraint_spec, with_param
from gclm.server.openai.output import PLAIN, OutputSpec, StreamReader
from gclm.server.openai.protocol import GenerationBody
from gclm.server.openai.reasoning import ReasoningParser, ThinkingControls
from gclm.server.openai.render import ChoiceOutput, Renderer, Usage
from gclm.server.openai.tools.prompt import ToolPlan
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
        self.started = int(time.time())  # the model cards' `created`

    def thinks(self, body: GenerationBody) -> bool:
        """Whether the request thinks before its output (a reasoning model's chat)."""
        return (
            self.reasoning is not None
            and isinstance(body, ThinkingControls)
            and body.wants_thinking()
        )

    def output_spec(
        self, body: GenerationBody, tools: ToolPlan | None, include_reasoning: bool = True
    ) -> OutputSpec:
        """What the request's output holds: a thinking request's thinking, and calls where
        its tools allow them (the parsers that read them: output.py)."""
        return OutputSpec(
            thinking=self.reasoning if self.thinks(body) else None,
            include_reasoning=include_reasoning,
            tool_calls=tools is not None and tools.calls_allowed,
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
        """The pipeline: plan (compile, budget), submit every choice, answer (JSON or SSE)."""
        try:
            # A client that leaves while its constraint compiles stops the compile, unless
            # another request waits for it (Constraints._wait, TableCache.abandon).
            plan = await until_disconnected(
                request.receive, self.to_plan(request, body, prompts, renderer.id, renderer.output)
            )
        except ClientDisconnected:
            self.metrics.disconnects.inc()
            return Response(status_code=CLIENT_CLOSED)
        sequences = Choices(self.engine, self.submit_all(list(plan.requests)))
        self.metrics.prompt_tokens.inc(plan.prompt_tokens)
        fold = EventFold(plan, renderer, self.metrics)
        if plan.stream:
            events = self.stream(request, sequences, fold)
            return EventStreamResponse(
                events, on_close=sequences.close, on_disconnect=self.metrics.disconnects.inc
            )
        try:
            await until_disconnected(request.receive, self.collect(sequences, fold))
        except ClientDisconnected:
            self.metrics.disconnects.inc()
            return Response(status_code=CLIENT_CLOSED)
        finally:
            sequences.close()
        usage = self.charged_usage(request, fold)
        final = renderer.final(fold.outputs(), usage)
        await renderer.settle()
        return Response(final.model_dump_json(), media_type="application/json")

    async def to_plan(
        self,
        request: Request,
        body: GenerationBody,
        prompts: list[list[int]],
        request_id: str,
        output: OutputSpec = PLAIN,
    ) -> GenerationPlan:
        """Decide everything the request needs, once: its choices' requests to the engine
        (prompt, sampling, compiled constraint, budget, thinking), and how to answer.

        Choices are numbered prompt-major: choice `p * n + i` is sample `i` of prompt `p`.
        Raises what the request cannot have: a dead engine (503, before compiling), too
        many choices, a constraint that does not compile, a budget too small for it.
        """
        self.engine.check_health()  # a dead engine: 503 now, not after compiling
        self.check_admissible(body, len(prompts))
        # Off the event loop: reading a grammar or writing the tools' regex grows with the
        # request (a 20,000-character case-insensitive literal held the loop for 14 s).
        spec = await asyncio.to_thread(self.read_constraint, body)
        if spec is not None and spec.calls is not None:
            output = replace(output, calls=spec.calls)  # how its tool calls are written
        parser = self.reasoning if self.thinks(body) else None
        started = time.perf_counter()
        try:
            constraint, max_tokens, thinking = await self.constrain(request, body, spec, parser)
        finally:
            if spec is not None:  # once a request, whichever tables it waited for
                self.metrics.compile_seconds.observe(time.perf_counter() - started)
        requests = tuple(
            GenerationRequest(
                prompt_ids=prompt,
                params=body.sampling_params(max_tokens, sample=i),
                constraint=constraint,
                thinking=thinking,
                request_id=f"{request_id}-{p * body.n + i}",
            )
            for p, prompt in enumerate(prompts)
            for i in range(body.n)
        )
        return GenerationPlan(
            requests=requests,
            n=body.n,
            prompt_tokens=sum(len(p) for p in prompts),
            constraint=spec,
            max_tokens=max_tokens,
            thinking=thinking,
            stream=body.stream,
            include_usage=body.include_usage,
            with_logprobs=body.logprobs_count is not None,
            output=output,
        )

    async def constrain(
        self,
        request: Request,
        body: GenerationBody,
        spec: ConstraintSpec | None,
        parser: ReasoningParser | None,
    ) -> tuple[PreparedConstraint | None, int, ThinkingSpec | None]:
        """The request's constraint prepared by the engine (server/engine/prepare.py), its
        max_tokens and its thinking spec."""
        requested, param = body.budget_request()
        s = self.settings
        marker = ThinkingSpec(parser.end_ids) if parser is not None else None
        constraint = None
        if spec is None:
            max_tokens = requested if requested is not None else s.default_max_tokens
        else:
            # One wait for every table the request asks for: its first masks, then maybe
            # the whole.
            deadline = time.monotonic() + s.compile_timeout + 1.0
            budget = BudgetAsk(
                requested, param, s.constrained_max_tokens_floor, s.constrained_max_tokens_factor
            )
            try:
                constraint, max_tokens = await self.engine.constraints.prepare(
                    spec.constraint,
                    budget,
                    budget_aware=spec.budget_aware,
                    policy=spec.budget_policy,
                    thinking=marker,
                    deadline=deadline,
                    report=_Report(request, self.metrics),
                )
            except ConstraintError as e:
                raise with_param(e, spec.param) from None
        thinking = None
        if parser is not None and isinstance(body, ThinkingControls):
            table = constraint.table if constraint is not None else None
            thinking = parser.thinking(body, table, max_tokens)
        return constraint, max_tokens, thinking

    def read_constraint(self, body: GenerationBody) -> ConstraintSpec | None:
        """`constraint_spec`, within --compile-timeout: the tools' regex is written here, in
        the request (a tool's schema can take minutes to normalise, as some real ones do)."""
        limit = self.settings.compile_timeout
        try:
            with work_deadline(limit):
                return constraint_spec(body, self.settings.additional_properties)
        except OutOfTime:
            error = CompileLimitError(
                f"Writing this request's constraint (its tools' schemas and grammars) took "
                f"more than {limit:g} s; simplify them (fewer oneOf/anyOf combinations, less "
                "nesting) or raise --compile-timeout."
            )
            error.param = "tools"
            raise error from None

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

    async def collect(self, sequences: Choices, fold: EventFold) -> None:
        """Fold every choice's events; raises the first error any choice reports (the
        others are then cancelled)."""
        async with aclosing(sequences.events()) as events:
            async for index, event in events:
                fold.add(index, event)

    async def stream(
        self, request: Request, sequences: Choices, fold: EventFold
    ) -> AsyncGenerator[bytes, None]:
        """SSE body: opening chunks; each event folded, read once by the output parsers
        (output.py's StreamReader) and written once by the renderer, as it comes; closing
        (usage), and the renderer's end marker ([DONE]).

        An error from any choice ends the stream with the renderer's failure events.
        """
        renderer, plan = fold.renderer, fold.plan
        frame, reader = renderer.frame, StreamReader(plan.output, plan.choices)
        for chunk in renderer.opening(len(sequences.handles)):
            yield frame(chunk)
        async with aclosing(sequences.events()) as events:
            async for index, event in events:
                try:
                    fold.add(index, event)
                except GclmError as error:
                    self.metrics.reject(error.code or error.error_type)
                    for line in renderer.failure(error):
                        yield line
                    return
                chunks: list[BaseModel] = []
                if isinstance(event, TokenEvent) and event.reasoning:
                    if text := reader.thought(index, event.text):
                        chunks = renderer.reasoning_delta(index, text)
                elif isinstance(event, TokenEvent):
                    # A token that completes no character yet sends nothing (its logprob
                    # goes with the text that completes it).
                    if event.text or (plan.with_logprobs and event.logprobs):
                        logprobs = event.logprobs if plan.with_logprobs else None
                        chunks = renderer.delta(reader.delta(index, event.text, logprobs))
                elif isinstance(event, FinishEvent):
                    held, finished = reader.finish(index, fold.finish_reasons[index])
                    chunks = renderer.delta(held) if held is not None else []
                    chunks += renderer.finish(finished)
                for chunk in chunks:
                    yield frame(chunk)
        usage = self.charged_usage(request, fold)
        closing = renderer.closing(usage, plan.include_usage)
        try:
            await renderer.settle()
        except GclmError as error:
            self.metrics.reject(error.code or error.error_type)
            for line in renderer.failure(error):
                yield line
            return
        for chunk in closing:
            yield frame(chunk)
        if renderer.done is not None:
            yield renderer.done

    def charged_usage(self, request: Request, fold: EventFold) -> Usage:
        """The request's usage, its tokens charged to the request's API key."""
        usage = fold.usage()
        charge(request, tokens=usage.total_tokens)
        return usage


@dataclass(frozen=True)
class GenerationPlan:
    """What one generation request asks for, decided once (`Serving.to_plan`); the stages
    after it (submit, the fold, the answer) read the plan, not the request body."""

    requests: tuple[GenerationRequest, ...]  # one per choice, prompt-major (p * n + i)
    n: int  # choices per prompt: they share the prompt (and its cached tokens)
    prompt_tokens: int  # of all prompts
    constraint: ConstraintSpec | None  # what was compiled, and from which parameter
    max_tokens: int  # every choice's budget
    thinking: ThinkingSpec | None  # how a thinking request thinks (None: it does not)
    stream: bool
    include_usage: bool  # a stream's usage chunk
    with_logprobs: bool
    output: OutputSpec = PLAIN  # what the output holds, and the parsers that read it back

    @property
    def choices(self) -> int:
        return len(self.requests)


class EventFold:
    """The one fold over a request's engine events, for streamed and collected answers
    alike: each choice's output and finish_reason, and the usage (the tokens generated in
    all; the prompt tokens the engine reused, once per prompt as its n choices share it; the
    thinking tokens of a thinking request)."""

    def __init__(self, plan: GenerationPlan, renderer: Renderer, metrics: Metrics) -> None:
        self.plan, self.renderer, self.metrics = plan, renderer, metrics
        choices = plan.choices
        self._text: list[list[str]] = [[] for _ in range(choices)]
        self._thought: list[list[str]] = [[] for _ in range(choices)]
        self._logprobs: list[list[TokenLogprob]] = [[] for _ in range(choices)]
        self.finish_reasons = ["stop"] * choices
        self._reasoning = [0] * choices
        self.completion_tokens = self.cached_tokens = 0
        self.reasoning_tokens: int | None = None  # None: no choice thinks

    def add(self, index: int, event: StreamEvent) -> None:
        """Fold in choice `index`'s next event; an ErrorEvent raises its error (a
        GclmError, for the client)."""
        if isinstance(event, TokenEvent):
            (self._thought if event.reasoning else self._text)[index].append(event.text)
            if self.plan.with_logprobs:
                self._logprobs[index].extend(event.logprobs)
        elif isinstance(event, FinishEvent):
            self.finish_reasons[index] = self.plan.output.finish_reason(event)
            self.completion_tokens += event.completion_tokens
            if index % self.plan.n == 0:
                self.cached_tokens += event.cached_tokens
            if event.reasoning_tokens is not None:
                self._reasoning[index] = event.reasoning_tokens
                self.reasoning_tokens = (self.reasoning_tokens or 0) + event.reasoning_tokens
            self.metrics.completion_tokens.inc(event.completion_tokens)
        else:
            raise as_gclm_error(event.error)

    def outputs(self) -> list[ChoiceOutput]:
        """Every choice's whole output, read once by its output parsers (output.py)."""
        outputs = []
        for i in range(self.plan.choices):
            text, thought = "".join(self._text[i]), "".join(self._thought[i])
            reader = self.plan.output.reader()
            read = reader.read_all(text, thought)
            out = ChoiceOutput(
                text=text,
                finish_reason=self.finish_reasons[i],
                logprobs=self._logprobs[i] if self.plan.with_logprobs else None,
                reasoning=thought,
                reasoning_tokens=self._reasoning[i],
                read=read,
                calls=reader.calls,
            )
            outputs.append(out)
        return outputs

    def usage(self) -> Usage:
        usage = Usage.of(self.plan.prompt_tokens, self.completion_tokens, self.cached_tokens)
        return usage.with_reasoning_tokens(self.reasoning_tokens)


@dataclass(frozen=True)
class _Report:
    """A request's PrepareReport (server/engine/prepare.py): the compile seconds go to its
    API key, first masks to /metrics."""

    request: Request
    metrics: Metrics

    def compile_seconds(self, seconds: float) -> None:
        charge(self.request, compile_seconds=seconds)

    def first_masks(self) -> None:
        self.metrics.first_masks.inc()
