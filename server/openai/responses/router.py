"""POST /v1/responses: parse, say what the output holds, and hand on to the serving pipeline."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool

from gclm.server.engine.protocol import Engine
from gclm.server.openai.reasoning import check_reasoning
from gclm.server.openai.responses.protocol import ResponsesRequest
from gclm.server.openai.responses.render import ResponsesRenderer
from gclm.server.openai.serving import serving_of
from gclm.server.openai.tools.prompt import prompt_messages, template_tools

router = APIRouter(prefix="/v1")


@router.post("/responses")
async def responses(request: Request) -> Response:
    serving = serving_of(request)
    engine = serving.engine
    body = ResponsesRequest.parse(await request.body())
    serving.check_model(body)
    check_reasoning(body, serving.reasoning, param="reasoning")
    # Templating and tokenizing run in a worker thread: a long prompt must not stop the event
    # loop, which answers every other request and /health.
    prompt = await run_in_threadpool(responses_prompt, engine, body)
    output = serving.output_spec(body, body.tool_plan, body.include_reasoning)
    renderer = ResponsesRenderer(engine.model_id, body, output)
    return await serving.generate(request, body, [prompt], renderer)


def responses_prompt(engine: Engine, body: ResponsesRequest) -> list[int]:
    """The prompt's token ids: the instructions and input items (with the tools) through the
    model's chat template."""
    native = engine.prompts.renders_tools
    messages = prompt_messages(body.messages(), body.chat_tools, body.tool_plan, native)
    kwargs = template_tools(body.chat_tools, native, body.template_kwargs())
    return engine.prompts.encode_chat(messages, **kwargs)


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
