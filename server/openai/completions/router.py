"""POST /v1/completions: parse, tokenize the prompts, and hand on to the serving pipeline."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool

from gclm.server.engine.protocol import Engine
from gclm.server.openai.completions.protocol import CompletionRequest
from gclm.server.openai.completions.render import CompletionRenderer
from gclm.server.openai.constraint_spec import name_backend
from gclm.server.openai.serving import serving_of

router = APIRouter(prefix="/v1")


@router.post("/completions")
async def completions(request: Request) -> Response:
    serving = serving_of(request)
    body = CompletionRequest.parse(await request.body())
    serving.check_model(body)
    # Tokenizing runs in a worker thread: long prompts must not stop the event loop.
    prompts = await run_in_threadpool(completion_prompts, serving.engine, body)
    renderer = CompletionRenderer(serving.engine.model_id)
    return name_backend(await serving.generate(request, body, prompts, renderer), body)


def completion_prompts(engine: Engine, body: CompletionRequest) -> list[list[int]]:
    """Each prompt's token ids (token-id prompts as given)."""
    return [p if isinstance(p, list) else engine.prompts.encode_prompt(p) for p in body.prompt]


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
