"""The OpenAI-compatible HTTP API over an `Engine`.

    app = create_app(engine, ServerSettings.from_env())

One generation request flows: parse and refuse what gclm cannot honour (openai/protocol.py, or
openai/responses/protocol.py for /v1/responses) -> constraint -> `engine.compile` -> budget
check -> one `engine.submit` per choice -> events merged per request (streaming) -> JSON body or
Server-Sent Events (a Renderer: openai/render.py, openai/responses/render.py). The three generating
endpoints share that path; they differ only in their request model and their renderer. A client that
disconnects, streaming or not, has its sequences cancelled at once.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextlib import aclosing

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST

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
from gclm.server.http.body_limit import BodySizeLimit
from gclm.server.http.browsers import install_browser_guards
from gclm.server.http.errors import CLIENT_CLOSED, as_gclm_error, install_error_handlers
from gclm.server.http.keys import CompileCharges, charge, load_keys
from gclm.server.http.metrics import Metrics, RequestCounter
from gclm.server.http.openapi import document
from gclm.server.http.streaming import (
    Choices,
    ClientDisconnected,
    EventStreamResponse,
    until_disconnected,
)
from gclm.server.openai.constraint_spec import ConstraintSpec, constraint_spec, with_param
from gclm.server.openai.protocol import (
    MAX_N,
    ChatCompletionRequest,
    CompletionRequest,
    GenerationBody,
)
from gclm.server.openai.reasoning import (
    ReasoningChatRenderer,
    ReasoningParser,
    ReasoningToolChatRenderer,
    ThinkingControls,
    check_reasoning,
    reasoning_schema,
    with_reasoning_tokens,
)
from gclm.server.openai.render import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatRenderer,
    ChoiceOutput,
    Completion,
    CompletionRenderer,
    ModelCard,
    ModelList,
    Renderer,
    Usage,
)
from gclm.server.openai.responses.function_calls import ResponsesToolRenderer
from gclm.server.openai.responses.protocol import ResponsesRequest
from gclm.server.openai.responses.render import ResponseBody, ResponseEvent, ResponsesRenderer
from gclm.server.openai.tools.calls import ToolChatRenderer
from gclm.server.openai.tools.prompt import prompt_messages, template_tools
from gclm.server.settings import ServerSettings

GENERATING = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/responses"})
ENDPOINTS = frozenset(
    {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/models",
        "/health",
        "/metrics",
    }
)


def create_app(
    engine: Engine, settings: ServerSettings | None = None, reasoning: ReasoningParser | None = None
) -> FastAPI:
    """Build the FastAPI app serving `engine` (the engine's lifetime is the caller's);
    `reasoning`: the served model's thinking markers (server/openai/reasoning.py)."""
    settings = settings or ServerSettings()
    metrics = Metrics(engine)
    service = _Service(engine, settings, metrics)
    service.reasoning = reasoning
    started = int(time.time())

    # No /docs or /redoc: FastAPI's pages load their scripts from a CDN (third-party code in
    # the browser of whoever opens them, and a blank page offline). The document itself is
    # /openapi.json, for any OpenAPI viewer or client generator.
    app = FastAPI(
        title="gclm",
        summary="Constrained generation, OpenAI-compatible.",
        docs_url=None,
        redoc_url=None,
    )
    app.state.engine, app.state.settings, app.state.metrics = engine, settings, metrics
    install_error_handlers(app, metrics.reject, metrics.disconnects.inc)
    app.add_middleware(
        BodySizeLimit, max_bytes=settings.max_body_size << 20, on_rejection=metrics.reject
    )
    install_browser_guards(app, settings, metrics, load_keys(settings), GENERATING)
    app.add_middleware(RequestCounter, metrics=metrics, endpoints=ENDPOINTS)  # outermost

    api = APIRouter(prefix="/v1")

    @api.post("/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = ChatCompletionRequest.parse(await request.body())
        service.check_model(body)
        check_reasoning(body, service.reasoning)
        plan = body.tool_plan
        prompt = await run_in_threadpool(service.chat_prompt, body)
        renderer = ChatRenderer(engine.model_id)
        tools = plan is not None and plan.calls_allowed
        if service.reasoning is not None and service.thinks(body):
            thinking = ReasoningToolChatRenderer if tools else ReasoningChatRenderer
            renderer = thinking(engine.model_id, service.reasoning, body.include_reasoning)
        elif tools:
            renderer = ToolChatRenderer(engine.model_id)
        return await service.generate(request, body, [prompt], renderer)

    @api.post("/completions")
    async def completions(request: Request) -> Response:
        body = CompletionRequest.parse(await request.body())
        service.check_model(body)
        prompts = await run_in_threadpool(service.completion_prompts, body)
        return await service.generate(request, body, prompts, CompletionRenderer(engine.model_id))

    @api.post("/responses")
    async def responses(request: Request) -> Response:
        body = ResponsesRequest.parse(await request.body())
        service.check_model(body)
        check_reasoning(body, service.reasoning, param="reasoning")
        prompt = await run_in_threadpool(service.responses_prompt, body)
        parser = service.reasoning if service.thinks(body) else None
        renderer = ResponsesRenderer(engine.model_id, body, parser)
        if body.tool_plan is not None and body.tool_plan.calls_allowed:
            renderer = ResponsesToolRenderer(engine.model_id, body, parser)
        return await service.generate(request, body, [prompt], renderer)

    @api.get("/models")
    async def list_models() -> ModelList:
        return ModelList(data=[ModelCard(id=engine.model_id, created=started)])

    @api.get("/models/{model_id:path}")
    async def get_model(model_id: str) -> ModelCard:
        if model_id != engine.model_id:
            raise ModelNotFoundError(model_id, engine.model_id)
        return ModelCard(id=engine.model_id, created=started)

    app.include_router(api)
    document(
        app,
        {
            "/v1/chat/completions": (ChatCompletionRequest, ChatCompletion, ChatCompletionChunk),
            "/v1/completions": (CompletionRequest, Completion, Completion),
            "/v1/responses": (ResponsesRequest, ResponseBody, ResponseEvent),
        },
        # What check_model, check_reasoning and check_admissible (n, for one prompt) accept
        # on this server.
        served={
            "model": {"anyOf": [{"enum": [engine.model_id]}, {"type": "null"}]},
            "n": {
                "anyOf": [
                    {"type": "integer", "minimum": 1, "maximum": min(MAX_N, settings.queue_size)},
                    {"type": "null"},
                ]
            },
            **reasoning_schema(reasoning),
        },
    )

    @app.get("/health")
    async def health() -> dict[str, str]:
        """200 while the engine serves; 503 (EngineDeadError, OpenAI-shaped) once it died."""
        engine.check_health()
        return {"status": "ok", "model": engine.model_id}

    # HEAD for load balancers' checks; one documented operation is enough.
    app.add_api_route("/health", health, methods=["HEAD"], include_in_schema=False)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus_metrics() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return app


class _Service:
    """What the endpoints share: the engine, the settings, the metrics."""

    def __init__(self, engine: Engine, settings: ServerSettings, metrics: Metrics) -> None:
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self.reasoning: ReasoningParser | None = None
        self.compile_charges = CompileCharges()

    # Templating and tokenizing run in a worker thread (run_in_threadpool): a long prompt must
    # not stop the event loop, which answers every other request and /health.
    def chat_prompt(self, body: ChatCompletionRequest) -> list[int]:
        native = self.engine.renders_tools
        messages = [m.for_template() for m in body.messages]
        messages = prompt_messages(messages, body.tools, body.tool_plan, native)
        kwargs = template_tools(body.tools, native, body.template_kwargs())
        return self.engine.encode_chat(messages, **kwargs)

    def responses_prompt(self, body: ResponsesRequest) -> list[int]:
        native = self.engine.renders_tools
        messages = prompt_messages(body.messages(), body.chat_tools, body.tool_plan, native)
        kwargs = template_tools(body.chat_tools, native, body.template_kwargs())
        return self.engine.encode_chat(messages, **kwargs)

    def completion_prompts(self, body: CompletionRequest) -> list[list[int]]:
        return [p if isinstance(p, list) else self.engine.encode_prompt(p) for p in body.prompt]

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
