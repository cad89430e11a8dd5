"""The OpenAI-compatible HTTP API over an `Engine`: the app factory.

    app = create_app(engine, ServerSettings.from_env())

It installs the middlewares (body limit, browser guards, keys, request counting), one router
per API (server/openai/chat/, completions/, responses/, and models.py), the OpenAPI document,
/health and /metrics. What a generation request goes through is server/openai/serving.py.
"""

from __future__ import annotations

from fastapi import FastAPI, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST

from gclm.server.engine.protocol import Engine
from gclm.server.http.body_limit import BodySizeLimit
from gclm.server.http.browsers import install_browser_guards
from gclm.server.http.errors import install_error_handlers
from gclm.server.http.keys import load_keys
from gclm.server.http.metrics import Metrics, RequestCounter
from gclm.server.http.openapi import document
from gclm.server.openai import models as models_api
from gclm.server.openai.chat import router as chat_api
from gclm.server.openai.chat.protocol import ChatCompletionRequest
from gclm.server.openai.chat.render import ChatCompletion, ChatCompletionChunk
from gclm.server.openai.completions import router as completions_api
from gclm.server.openai.completions.protocol import CompletionRequest
from gclm.server.openai.completions.render import Completion
from gclm.server.openai.protocol import MAX_N
from gclm.server.openai.reasoning import ReasoningParser, reasoning_schema
from gclm.server.openai.responses import router as responses_api
from gclm.server.openai.responses.protocol import ResponsesRequest
from gclm.server.openai.responses.render import ResponseBody, ResponseEvent
from gclm.server.openai.responses.store import ResponseStore
from gclm.server.openai.serving import Serving
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
    app.state.serving = Serving(engine, settings, metrics, reasoning)
    app.state.responses = ResponseStore.open(settings)  # the file opens on first use
    install_error_handlers(app, metrics.reject, metrics.disconnects.inc)
    app.add_middleware(
        BodySizeLimit, max_bytes=settings.max_body_size << 20, on_rejection=metrics.reject
    )
    install_browser_guards(app, settings, metrics, load_keys(settings), GENERATING)
    app.add_middleware(RequestCounter, metrics=metrics, endpoints=ENDPOINTS)  # outermost

    for api in (chat_api, completions_api, responses_api, models_api):
        api.attach_router(app)
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
