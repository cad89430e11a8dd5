"""A real uvicorn server on 127.0.0.1 (a free port) in a thread, configured as `gclm serve`
configures it (server/launch.py: server_config), for tests that need real sockets."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from starlette.types import ASGIApp

from gclm.server.launch import server_config
from gclm.server.settings import ServerSettings


@contextmanager
def serving(app: ASGIApp, settings: ServerSettings, loop: str = "auto") -> Iterator[int]:
    """Serve `app` with `settings`' connection limits on uvicorn's `loop` (auto: uvloop
    where installed); yields the port."""
    settings_here = ServerSettings(**{**settings.__dict__, "port": 0})
    server = uvicorn.Server(server_config(app, settings_here, log_config=None, loop=loop))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def connect(port: int, timeout: float = 10.0) -> socket.socket:
    """A socket to the server whose reads give up after `timeout` seconds."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.settimeout(timeout)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (socket.timeout if it
    does not within the socket's timeout)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def wait_for(check, timeout: float = 5.0) -> bool:
    """Whether `check()` came true within `timeout` seconds (polled every 50 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False
