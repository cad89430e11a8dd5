"""POST /v1/chat/completions: parse, pick the renderer, and hand on to the serving pipeline."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool

from gclm.server.engine.protocol import Engine
from gclm.server.openai.chat.protocol import ChatCompletionRequest
from gclm.server.openai.chat.reasoning import ReasoningChatRenderer, ReasoningToolChatRenderer
from gclm.server.openai.chat.render import ChatRenderer
from gclm.server.openai.chat.tool_calls import ToolChatRenderer
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
    plan = body.tool_plan
    # Templating and tokenizing run in a worker thread: a long prompt must not stop the event
    # loop, which answers every other request and /health.
    prompt = await run_in_threadpool(chat_prompt, engine, body)
    renderer = ChatRenderer(engine.model_id)
    tools = plan is not None and plan.calls_allowed
    if serving.reasoning is not None and serving.thinks(body):
        thinking = ReasoningToolChatRenderer if tools else ReasoningChatRenderer
        renderer = thinking(engine.model_id, serving.reasoning, body.include_reasoning)
    elif tools:
        renderer = ToolChatRenderer(engine.model_id)
    return await serving.generate(request, body, [prompt], renderer)


def chat_prompt(engine: Engine, body: ChatCompletionRequest) -> list[int]:
    """The prompt's token ids: the messages (with the tools and their results) through the
    model's chat template."""
    native = engine.renders_tools
    messages = [m.for_template() for m in body.messages]
    messages = prompt_messages(messages, body.tools, body.tool_plan, native)
    kwargs = template_tools(body.tools, native, body.template_kwargs())
    return engine.encode_chat(messages, **kwargs)


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
