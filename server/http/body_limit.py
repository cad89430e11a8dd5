"""The request body size limit, enforced before a body is read whole.

A body over the limit is a 413 in the OpenAI error shape: at once when its Content-Length
says so, or as soon as the bytes received pass the limit (chunked uploads, or a client whose
Content-Length lies). Without it a 100 MB body was read into memory, parsed, and only then
refused.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gclm.errors import RequestTooLargeError
from gclm.server.http.errors import RejectionHook, error_response


class BodySizeLimit:
    """Pure ASGI middleware: refuse HTTP request bodies larger than `max_bytes`."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, on_rejection: RejectionHook | None = None
    ) -> None:
        if max_bytes < 1:
            raise ValueError(f"the body size limit must be at least 1 byte, got {max_bytes}")
        self.app = app
        self.max_bytes = max_bytes
        self.on_rejection = on_rejection

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            error = RequestTooLargeError(self.max_bytes)
            if self.on_rejection is not None:
                self.on_rejection(error.code or error.error_type)
            await error_response(error)(scope, receive, send)
            return
        received = 0

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Raised inside the handler's `await request.body()`: the app's error
                    # handlers turn it into the 413 response.
                    raise RequestTooLargeError(self.max_bytes)
            return message

        await self.app(scope, counted_receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
