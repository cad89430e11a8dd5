"""Slow, silent, idle and departing clients on real sockets (127.0.0.1): each is closed
within its timeout or counted as a disconnect, never a 500 (server/http/connections.py,
server/http/errors.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import time

import httpx
import pytest
from fake_engine import FakeEngine
from socket_server import connect, read_until_closed, serving, wait_for

from gclm.server.app import create_app
from gclm.server.settings import ServerSettings

POST_HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
)


def metric(port: int, name: str, **labels: str) -> float:
    """The value of one sample on /metrics (0 when absent)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name) + (r"\{" + re.escape(wanted) + r"\}" if labels else "")
    found = re.search(f"^{pattern} (\\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def closed_after(sock: socket.socket) -> tuple[bytes, float]:
    """What the server sent before closing `sock`, and the seconds it took."""
    started = time.monotonic()
    return read_until_closed(sock), time.monotonic() - started


def test_a_hang_up_mid_body_is_a_disconnect_not_a_500(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO)
    with serving(create_app(FakeEngine()), ServerSettings(cache_dir=tmp_path)) as port:
        with connect(port) as sock:
            sock.sendall(POST_HEAD + b'{"messages": [')
        chat = {"endpoint": "/v1/chat/completions"}
        assert wait_for(lambda: metric(port, "gclm_requests_total", **chat, status="499") == 1)
        assert metric(port, "gclm_client_disconnects_total") == 1
        assert metric(port, "gclm_requests_total", **chat, status="500") == 0
    hang_ups = [r for r in caplog.records if "hung up" in r.getMessage()]
    assert len(hang_ups) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def test_a_connection_that_never_speaks_is_closed(tmp_path) -> None:
    settings = ServerSettings(cache_dir=tmp_path, header_timeout=0.5)
    with serving(create_app(FakeEngine()), settings) as port, connect(port) as sock:
        sent, seconds = closed_after(sock)
    assert sent.startswith(b"HTTP/1.1 408") and b"request_timeout" in sent
    assert 0.4 < seconds < 3


def test_headers_sent_a_byte_at_a_time_are_cut_off(tmp_path) -> None:
    settings = ServerSettings(cache_dir=tmp_path, header_timeout=0.5)
    with serving(create_app(FakeEngine()), settings) as port, connect(port) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        with pytest.raises(OSError):  # reset or broken pipe once the server has closed
            for _ in range(100):  # 10 s at most
                sock.sendall(b"X")
                time.sleep(0.1)
                if sock.recv(65536, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                    raise ConnectionResetError
        assert time.monotonic() - started < 3


def test_a_body_that_never_finishes_is_closed_and_counted(tmp_path) -> None:
    settings = ServerSettings(cache_dir=tmp_path, body_timeout=0.5)
    with serving(create_app(FakeEngine()), settings) as port:
        with connect(port) as sock:
            sock.sendall(POST_HEAD + b'{"messages": [')
            _, seconds = closed_after(sock)
        assert 0.4 < seconds < 3
        chat = {"endpoint": "/v1/chat/completions"}
        assert wait_for(lambda: metric(port, "gclm_requests_total", **chat, status="499") == 1)


def test_an_idle_kept_alive_connection_is_closed(tmp_path) -> None:
    settings = ServerSettings(cache_dir=tmp_path, keep_alive_timeout=0.5, header_timeout=30)
    with serving(create_app(FakeEngine()), settings) as port, connect(port) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        time.sleep(0.2)
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        rest, seconds = closed_after(sock)
    assert rest == b"" and seconds < 3


def test_connections_past_the_cap_get_an_openai_shaped_503(tmp_path) -> None:
    settings = ServerSettings(cache_dir=tmp_path, max_connections=2, header_timeout=30)
    with serving(create_app(FakeEngine()), settings) as port:
        with connect(port) as one, connect(port) as two:
            for sock in (one, two):
                sock.sendall(b"GET /health HTTP/1.1\r\n")  # unfinished: the connection stays
            time.sleep(0.2)
            with connect(port) as third:
                third.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                answer, _ = closed_after(third)  # connection: close frees its place
        assert wait_for(
            lambda: httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
        )
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *fields = head.decode().split("\r\n")
    headers = dict(field.lower().split(": ", 1) for field in fields)
    assert status.startswith("HTTP/1.1 503")
    assert headers["content-type"] == "application/json"
    assert headers["retry-after"] == "1" and headers["connection"] == "close"
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == ("server_error", "too_many_connections")
    assert "--max-connections" in error["message"]


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_headers_that_arrived_in_time_are_read_after_the_loop_stalls(tmp_path, loop) -> None:
    """The server's loop is busy (a callback blocks it 1.5 s) across a connection's header
    deadline, and the headers arrived before it: the request is served. On uvloop the
    timer runs before the next poll for input, and closed such a connection with a 408."""
    pytest.importorskip(loop)
    stall_r, stall_w = socket.socketpair()

    def stall() -> None:  # an input callback that takes its time, as a busy server's may
        stall_r.recv(1)
        time.sleep(1.5)

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/arm":
            asyncio.get_running_loop().add_reader(stall_r.fileno(), stall)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    settings = ServerSettings(cache_dir=tmp_path, header_timeout=0.5)
    with stall_r, stall_w, serving(app, settings, loop=loop) as port:
        assert httpx.get(f"http://127.0.0.1:{port}/arm", timeout=5).status_code == 200
        with connect(port) as sock:
            time.sleep(0.2)  # accepted: its header timer runs
            stall_w.send(b"x")  # the loop blocks from now until 1.5 s past its deadline
            time.sleep(0.1)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:80]
