"""One HTTP request's sequences: read together, cancelled together, sent as SSE.

`Choices` merges the engine streams of a request's choices (n > 1, several prompts) into
one stream of `(choice index, event)` and cancels whatever has not finished when the reader
stops for any reason. `until_disconnected` races work against the client going away, so a
disconnect cancels generation at once rather than at the next write. `EventStreamResponse`
sends Server-Sent Events under that race.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from typing import Any, TypeVar

from pydantic import BaseModel
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gclm.errors import InternalError
from gclm.server.engine.protocol import Engine, ErrorEvent, FinishEvent, Handle, StreamEvent
from gclm.server.http.errors import gclm_error_body

T = TypeVar("T")

DONE = b"data: [DONE]\n\n"


class ClientDisconnected(Exception):
    """The HTTP client went away before the response was complete."""


class Choices:
    """The engine handles of one HTTP request; a handle's position is its choice index."""

    def __init__(self, engine: Engine, handles: list[Handle]) -> None:
        self.engine = engine
        self.handles = handles
        self._done = [False] * len(handles)
        self._pumps: list[asyncio.Task[None]] = []

    async def events(self) -> AsyncGenerator[tuple[int, StreamEvent], None]:
        """Every choice's events as they arrive, tagged with the choice index.

        Each choice ends with exactly one FinishEvent or ErrorEvent; a stream that raises or
        ends without one is reported as an ErrorEvent. However the iteration stops, the
        choices still running are cancelled (use `contextlib.aclosing` so that happens at
        once, not when the generator is collected).
        """
        queue: asyncio.Queue[tuple[int, StreamEvent]] = asyncio.Queue()
        self._pumps = [
            asyncio.create_task(self._pump(i, handle, queue))
            for i, handle in enumerate(self.handles)
        ]
        try:
            while not all(self._done):
                index, event = await queue.get()
                if isinstance(event, FinishEvent | ErrorEvent):
                    self._done[index] = True
                yield index, event
        finally:
            self.close()

    async def _pump(
        self, index: int, handle: Handle, queue: asyncio.Queue[tuple[int, StreamEvent]]
    ) -> None:
        error: Exception
        stream = self.engine.stream(handle)
        try:
            async for event in stream:
                if isinstance(event, FinishEvent) and event.finish_reason == "cancelled":
                    # We stop reading before cancelling, so the engine cancelled on its own.
                    event = ErrorEvent(
                        InternalError("The engine cancelled this request before it finished.")
                    )
                await queue.put((index, event))
                if isinstance(event, FinishEvent | ErrorEvent):
                    return
            error = InternalError("The engine's stream ended without a finish event.")
        except Exception as e:  # reported to the client like an ErrorEvent from the engine
            error = e
        finally:
            # Leaving `async for` early does not close an async generator; run its cleanup now.
            if isinstance(stream, AsyncGenerator):
                await stream.aclose()
        await queue.put((index, ErrorEvent(error)))

    def close(self) -> None:
        """Cancel every choice that has not finished. Idempotent."""
        for i, handle in enumerate(self.handles):
            if not self._done[i]:
                self._done[i] = True
                self.engine.cancel(handle)
        for task in self._pumps:
            task.cancel()


async def wait_for_disconnect(receive: Receive) -> None:
    """Return when the ASGI server reports that the client has gone (body already read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnected(receive: Receive, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it if the client disconnects first.

    Raises ClientDisconnected in that case. Call only after the request body has been read:
    from then on the ASGI receive channel carries nothing but the disconnect.
    """
    work_task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(receive))
    try:
        await asyncio.wait({work_task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if work_task.done():
            return work_task.result()
        raise ClientDisconnected
    finally:
        for task in (work_task, watcher):
            task.cancel()
        await asyncio.gather(work_task, watcher, return_exceptions=True)


def sse(body: BaseModel | dict[str, Any]) -> bytes:
    """One Server-Sent Event carrying a JSON body."""
    if isinstance(body, BaseModel):
        text = body.model_dump_json()
    else:
        text = json.dumps(body, ensure_ascii=False)
    return b"data: " + text.encode() + b"\n\n"


def sse_error(exc: BaseException) -> bytes:
    """An error inside a stream: the OpenAI error object as a data line."""
    return sse(gclm_error_body(exc))


class EventStreamResponse(Response):
    """A text/event-stream response that stops, and calls `on_close`, when the client goes.

    Starlette's StreamingResponse notices a disconnect only at its next write under ASGI
    spec 2.4, and does not close its iterator; generation would run on for nothing.
    """

    media_type = "text/event-stream"  # type: ignore[assignment]  # Starlette's is typed None

    def __init__(
        self,
        events: AsyncGenerator[bytes, None],
        on_close: Callable[[], None] | None = None,
        on_disconnect: Callable[[], None] | None = None,
    ) -> None:
        self.events = events
        self.on_close = on_close  # always, once the response is over
        self.on_disconnect = on_disconnect  # when the client left before the end
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        try:
            await until_disconnected(receive, self._pump(send))
        except (ClientDisconnected, OSError):
            # OSError: the server's send found the connection closed (ASGI spec 2.4).
            if self.on_disconnect is not None:
                self.on_disconnect()
        finally:
            if self.on_close is not None:
                self.on_close()

    async def _pump(self, send: Send) -> None:
        async with aclosing(self.events) as events:
            async for data in events:
                await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
