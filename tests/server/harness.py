"""Drive the app in-process: an ASGI transport that streams, and clients built on it.

httpx's own ASGITransport runs the app to completion before returning the response, so a
test could neither read a stream chunk by chunk nor disconnect in the middle of one. This
transport returns as soon as the app starts its response, streams the body as the app sends
it, and reports `http.disconnect` to the app when the response is closed early or the
request is cancelled, as uvicorn does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import httpx
import openai
from starlette.types import ASGIApp

BASE_URL = "http://gclm.test"
API_KEY = "sk-test"

Message = MutableMapping[str, Any]


class StreamingASGITransport(httpx.AsyncBaseTransport):
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": request.method,
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "scheme": request.url.scheme,
            "path": request.url.path,
            "raw_path": request.url.raw_path.split(b"?")[0],
            "query_string": request.url.query,
            "server": (request.url.host, request.url.port),
            "client": ("127.0.0.1", 4321),
            "root_path": "",
        }
        disconnected = asyncio.Event()
        started: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        body_sent = False

        async def receive() -> Message:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            if disconnected.is_set():
                return  # uvicorn drops what is sent after a disconnect
            if message["type"] == "http.response.start":
                started.set_result(message)
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    chunks.put_nowait(message["body"])
                if not message.get("more_body", False):
                    chunks.put_nowait(None)

        async def run() -> None:
            try:
                await self.app(scope, receive, send)
            finally:
                chunks.put_nowait(None)

        task = asyncio.create_task(run())
        try:
            await asyncio.wait({started, task}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            disconnected.set()  # the caller gave up while waiting: a disconnect
            await asyncio.gather(task, return_exceptions=True)
            raise
        if not started.done():
            task.result()  # the app's exception, if it raised one
            raise RuntimeError("the app returned without starting a response")
        start = started.result()
        return httpx.Response(
            start["status"],
            headers=start.get("headers", []),
            stream=_AppBody(chunks, disconnected, task),
        )


class _AppBody(httpx.AsyncByteStream):
    def __init__(
        self,
        chunks: asyncio.Queue[bytes | None],
        disconnected: asyncio.Event,
        task: asyncio.Task[None],
    ) -> None:
        self.chunks = chunks
        self.disconnected = disconnected
        self.task = task

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (chunk := await self.chunks.get()) is not None:
            yield chunk

    async def aclose(self) -> None:
        self.disconnected.set()  # a no-op for the app if the body was complete
        await self.task  # re-raises what the app raised


def http_client(app: ASGIApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=StreamingASGITransport(app), base_url=BASE_URL)


@asynccontextmanager
async def openai_client(app: ASGIApp, api_key: str = API_KEY) -> AsyncIterator[openai.AsyncOpenAI]:
    """The official SDK talking to `app` in-process; no retries, so 429s surface."""
    async with http_client(app) as http:
        yield openai.AsyncOpenAI(
            base_url=f"{BASE_URL}/v1", api_key=api_key, http_client=http, max_retries=0
        )


async def sse_events(response: httpx.Response) -> list[str]:
    """The `data:` payloads of an SSE response, in order."""
    return [
        line.removeprefix("data: ")
        async for line in response.aiter_lines()
        if line.startswith("data: ")
    ]
