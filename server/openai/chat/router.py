"""POST /v1/chat/completions: parse, say what the output holds, and hand on to the serving
pipeline."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool

from gclm.server.engine.protocol import Engine
from gclm.server.openai.chat.protocol import ChatCompletionRequest
from gclm.server.openai.chat.render import ChatRenderer
from gclm.server.openai.constraint_spec import name_backend
from gclm.server.openai.reasoning import check_reasoning
from gclm.server.openai.serving import serving_of
from gclm.server.openai.tools.prompt import prompt_messages, template_tools

router = APIRouter(prefix="/v1")


@router.post("/chat/completions")
async def chat_completions(request: Request) -> Response:
    serving = serving_of(request)
    engine = serving.engine
    body = ChatCompletionRequest.parse(await request.body())
    serving.check_model(body)
    check_reasoning(body, serving.reasoning)
    # Templating and tokenizing run in a worker thread: a long prompt must not stop the event
    # loop, which answers every other request and /health.
    prompt = await run_in_threadpool(chat_prompt, engine, body)
    output = serving.output_spec(body, body.tool_plan, body.include_reasoning)
    renderer = ChatRenderer(engine.model_id, output)
    return name_backend(await serving.generate(request, body, [prompt], renderer), body)


def chat_prompt(engine: Engine, body: ChatCompletionRequest) -> list[int]:
    """The prompt's token ids: the messages (with the tools and their results) through the
    model's chat template."""
    native = engine.prompts.renders_tools
    messages = [m.for_template() for m in body.messages]
    messages = prompt_messages(messages, body.tools, body.tool_plan, native)
    kwargs = template_tools(body.tools, native, body.template_kwargs())
    return engine.prompts.encode_chat(messages, **kwargs)


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
