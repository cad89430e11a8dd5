"""/v1/responses: POST parses, reads the stored conversation it continues, says what the
output holds and hands on to the serving pipeline; GET and DELETE read and delete stored
responses (responses/store.py), each API key seeing its own only.

Every database call runs in a worker thread: SQLite's file I/O must not stop the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

from fastapi import APIRouter, FastAPI, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from gclm.errors import InvalidRequestError, ResponseNotFoundError, ResponseStoreError
from gclm.server.engine.protocol import Engine
from gclm.server.http.keys import owner
from gclm.server.openai.reasoning import check_reasoning
from gclm.server.openai.responses.input_items import stored_item
from gclm.server.openai.responses.protocol import ResponsesRequest
from gclm.server.openai.responses.render import ResponseBody, ResponsesRenderer
from gclm.server.openai.responses.store import ResponseStore, StoredResponse
from gclm.server.openai.serving import serving_of
from gclm.server.openai.tools.prompt import prompt_messages, template_tools

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1")
T = TypeVar("T")


@router.post("/responses")
async def responses(request: Request) -> Response:
    serving = serving_of(request)
    engine = serving.engine
    raw = await request.body()
    body = ResponsesRequest.parse(raw)
    serving.check_model(body)
    check_reasoning(body, serving.reasoning, param="reasoning")
    store = store_of(request)
    who = owner(request)
    earlier: list[dict[str, Any]] = []
    size = len(raw)  # what the stored response holds, about
    if body.previous_response_id is not None:
        previous = await _stored(request, body.previous_response_id, "previous_response_id")
        earlier = previous.context + previous.output
        size += previous.size
    context = [*earlier, *(stored_item(item) for item in body.input)]
    if body.store is True and store is None:
        raise InvalidRequestError(
            "This server stores no responses (--responses-db off); set store to false.",
            param="store",
        )
    keep = None
    if body.stores and store is not None:  # unset `store` where none is stored: not stored
        keep = _keeper(store, who, context, size, bool(earlier))
    # Reading the stored turns back, templating and tokenizing run in worker threads: a long
    # conversation must not stop the event loop, which answers every other request and /health.
    if earlier:
        body = await run_in_threadpool(body.continued, earlier)
    prompt = await run_in_threadpool(responses_prompt, engine, body)
    output = serving.output_spec(body, body.tool_plan, body.include_reasoning)
    renderer = ResponsesRenderer(engine.model_id, body, output, keep)
    return await serving.generate(request, body, [prompt], renderer)


def _keeper(
    store: ResponseStore, who: str, context: list[dict[str, Any]], size: int, chained: bool
) -> Callable[[ResponseBody], Awaitable[None]]:
    """What stores the response once complete. The conversation's size (`size` bytes of JSON:
    the request's body and the stored turns it continues) is checked now, before any
    generation (`--responses-max-size`)."""
    limit = store.max_bytes
    if size > limit:
        raise InvalidRequestError(
            f"The conversation is about {size >> 20} MiB, over the {limit >> 20} MiB a stored "
            "response may hold (--responses-max-size). Start a new conversation without "
            "previous_response_id, or set store to false and send the turns in input.",
            param="previous_response_id" if chained else "input",
            code="conversation_too_large",
        )

    async def keep(body: ResponseBody) -> None:
        await _off_loop(store.put, who, body.model_dump(mode="json"), context)

    return keep


@router.get("/responses/{response_id}")
async def retrieve(request: Request, response_id: str) -> Response:
    """A stored response, as it was sent when complete."""
    stored = await _stored(request, response_id)
    return JSONResponse(stored.body)


@router.delete("/responses/{response_id}")
async def delete(request: Request, response_id: str) -> Response:
    store = _required(request)
    if not await _off_loop(store.delete, owner(request), response_id):
        raise ResponseNotFoundError(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


@router.get("/responses/{response_id}/input_items")
async def input_items(
    request: Request,
    response_id: str,
    limit: int = Query(default=20, ge=1, le=100),
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> Response:
    """The input items a stored response's model read (the earlier turns' too), a page at a
    time: `order` desc (newest first) by default, `after` an item id."""
    stored = await _stored(request, response_id)
    items = stored.context if order == "asc" else stored.context[::-1]
    if after is not None:
        ids = [item.get("id") for item in items]
        if after not in ids:
            raise InvalidRequestError(
                f"No input item with id {after!r} in response {response_id!r}.", param="after"
            )
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return JSONResponse(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit,
        }
    )


def store_of(request: Request) -> ResponseStore | None:
    """The app's response store (None: --responses-db off)."""
    store: ResponseStore | None = request.app.state.responses
    return store


def _required(request: Request) -> ResponseStore:
    store = store_of(request)
    if store is None:
        raise InvalidRequestError(
            "This server stores no responses (--responses-db off).", param=None
        )
    return store


async def _stored(request: Request, response_id: str, param: str | None = None) -> StoredResponse:
    """The request's key's stored response, or the 404 OpenAI gives."""
    store = _required(request)
    stored = await _off_loop(store.get, owner(request), response_id)
    if stored is None:
        raise ResponseNotFoundError(response_id, param=param)
    return stored


async def _off_loop(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in a worker thread; a database failure is a 500 that says so."""
    try:
        return await asyncio.to_thread(fn, *args)
    except (sqlite3.Error, OSError) as e:  # OSError: the database's folder
        log.error("the response store failed: %s", e)
        raise ResponseStoreError(
            f"The stored responses' database failed ({e}); try again."
        ) from None


def responses_prompt(engine: Engine, body: ResponsesRequest) -> list[int]:
    """The prompt's token ids: the instructions and input items (with the tools) through the
    model's chat template."""
    native = engine.prompts.renders_tools
    messages = prompt_messages(body.messages(), body.chat_tools, body.tool_plan, native)
    kwargs = template_tools(body.chat_tools, native, body.template_kwargs())
    return engine.prompts.encode_chat(messages, **kwargs)


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
