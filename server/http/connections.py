"""Slow connections closed: the HTTP/1.1 read timeouts uvicorn does not have.

uvicorn closes a kept-alive connection idle past `timeout_keep_alive` and answers 503 past
`limit_concurrency`, but a connection that never finishes its headers (a "slowloris" sending
a byte a second) or its body, or one that never sends a byte, stays open for ever: enough of
them hold every socket the server has. `guarded_h11(header_timeout, body_timeout,
max_connections)` is uvicorn's h11 protocol with one timer per connection:

- headers: from the connection opening, or the first byte of a kept-alive connection's next
  request, to the end of the request's headers; past it the client gets a 408 and the
  connection is closed;
- body: from the end of the headers to the end of the body; past it the connection is
  closed, which the app sees as the client leaving (one log line, a 499 in /metrics).

A timer that runs late (the server's loop was busy past the deadline) gives the
connection one more turn of the loop before it closes it: bytes that arrived in time may
still be unread: on uvloop, timers that fall due during a slow input callback run before
the loop polls for input again, and such a stall would cut off a client that did nothing
wrong.

One log line per connection closed. It also caps the connections: past `max_connections`
open (or as many requests in flight) a request gets a 503 in the OpenAI error shape with
Retry-After (`too_many_connections`), where uvicorn's own `limit_concurrency` would answer a
plain-text 503. `server_config` (server/launch.py) puts it in uvicorn.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from gclm.errors import TooManyConnectionsError
from gclm.server.http.errors import error_response

logger = logging.getLogger("gclm.server")

_TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)
_TIMEOUT_BODY = (
    b'{"error":{"message":"The request headers did not arrive in time; send them at once.",'
    b'"type":"invalid_request_error","param":null,"code":"request_timeout"}}'
)


# How late a timer may run before the connection is given one more turn of the loop (and
# how long that turn may take).
LATE_S = 0.1


def guarded_h11(
    header_timeout: float, body_timeout: float, max_connections: int
) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol closing a connection whose request headers take longer than
    `header_timeout` seconds to arrive, or whose body takes longer than `body_timeout`, and
    refusing requests past `max_connections` open connections."""
    if not header_timeout > 0 or not body_timeout > 0:
        raise ValueError("header and body timeouts must be positive numbers of seconds")
    if max_connections < 1:
        raise ValueError("max_connections must be at least 1")
    limits = {"headers": header_timeout, "body": body_timeout}
    too_many = error_response(TooManyConnectionsError(max_connections))
    too_many.headers["connection"] = "close"  # the refused connection frees its place

    class GuardedH11Protocol(H11Protocol):
        _timer: asyncio.TimerHandle | None = None
        _waiting_for: str | None = None
        _deadline = 0.0  # the loop's time the running timer is due
        _excused = False  # whether it has been given its turn after running late

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.limit_concurrency = None  # the cap is capped()'s, in the OpenAI shape
            self.app = self._capped(self.app)

        def _capped(self, app: ASGIApp) -> ASGIApp:
            async def capped(scope: Scope, receive: Receive, send: Send) -> None:
                # This connection and this request's task are already counted (uvicorn
                # adds the task before it runs), hence "more than".
                if len(self.connections) > max_connections or len(self.tasks) > max_connections:
                    logger.warning("refused a request: %d connections open", len(self.connections))
                    await too_many(scope, receive, send)
                    return
                await app(scope, receive, send)

            return capped

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._wait_for("headers")

        def connection_lost(self, exc: Exception | None) -> None:
            self._wait_for(None)
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            # The client's side of h11's state machine says what it still owes us.
            state = self.conn.their_state
            if state is h11.IDLE:
                # A kept-alive connection waiting for its next request is uvicorn's
                # keep-alive timer's; the first byte of that request starts ours.
                kept_alive = self.timeout_keep_alive_task is not None
                self._wait_for(None if kept_alive else "headers")
            elif state is h11.SEND_BODY:
                self._wait_for("body")
            else:
                self._wait_for(None)

        def _wait_for(self, part: str | None) -> None:
            if part == self._waiting_for:
                return  # the running timer keeps its start
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._waiting_for = part
            if part is not None:
                self._deadline = self.loop.time() + limits[part]
                self._excused = False
                self._timer = self.loop.call_at(self._deadline, self._expire, part)

        def _expire(self, part: str) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            if not self._excused and self.loop.time() - self._deadline > LATE_S:
                # The loop, not the client, was slow: read what has arrived first.
                self._excused = True
                self._timer = self.loop.call_later(LATE_S, self._expire, part)
                return
            client = "{}:{}".format(*self.client) if self.client else "?"
            logger.info(
                "closed the connection from %s: its request %s took over %g s",
                client,
                part,
                limits[part],
            )
            if part == "headers":
                self.transport.write(_TIMED_OUT % (len(_TIMEOUT_BODY), _TIMEOUT_BODY))
            self.transport.close()

    return GuardedH11Protocol
