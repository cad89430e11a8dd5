"""A client that leaves while its constraint compiles stops the compile, unless another
request waits for it (server/openai/serving.py: the plan races the disconnect;
server/engine/constraints.py counts the waiters; compiler/service/cache.py: TableCache.abandon).
Real sockets on 127.0.0.1, a BatchEngine over a tiny random Llama, compiles the test
holds back."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import Future
from typing import Any

import pytest
from socket_server import connect, serving, wait_for

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.service.cache import TableCache
from gclm.compiler.whole.compile import compile_constraint
from gclm.compiler.whole.tables import CompiledTable
from gclm.server.app import create_app
from gclm.server.settings import ServerSettings

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["n"],
    "additionalProperties": False,
}
BODY = json.dumps(
    {
        "model": "tiny",
        "messages": [{"role": "user", "content": "A number, please."}],
        "max_tokens": 16,
        "response_format": {"type": "json_schema", "json_schema": {"name": "N", "schema": SCHEMA}},
    }
).encode()
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY)
) + BODY


class HeldCompiles:
    """Whole compiles that end when the test says so (first masks are off)."""

    def __init__(self, vocab: Any) -> None:
        self.vocab = vocab
        self.started: list[tuple[Constraint, Future[CompiledTable]]] = []

    def __call__(self, constraint: Constraint) -> Future[CompiledTable]:
        future: Future[CompiledTable] = Future()
        self.started.append((constraint, future))
        return future

    def land(self) -> None:
        for constraint, future in self.started:
            if not future.done():
                future.set_result(compile_constraint(constraint, self.vocab))


@pytest.fixture
def held_server(embedded_vocab, tiny_batch_engine, tmp_path):
    compiles = HeldCompiles(embedded_vocab)
    engine = tiny_batch_engine(TableCache(compiles, embedded_vocab.fingerprint))
    settings = ServerSettings(cache_dir=tmp_path)
    try:
        with serving(create_app(engine, settings), settings) as port:
            yield port, compiles
    finally:
        compiles.land()
        engine.shutdown()


def ask(port: int) -> socket.socket:
    sock = connect(port, timeout=60)
    sock.sendall(REQUEST)
    return sock


def test_a_client_that_leaves_while_its_constraint_compiles_stops_the_compile(
    held_server,
) -> None:
    port, compiles = held_server
    sock = ask(port)
    assert wait_for(lambda: len(compiles.started) == 1, 10), "the compile never started"
    compile_ = compiles.started[0][1]
    time.sleep(0.2)
    assert not compile_.done()  # it waits for the compile...
    sock.close()  # ...and leaves
    assert wait_for(compile_.cancelled, 5), "the compile went on with nobody waiting"
    # The next request for it compiles again (a stopped compile is not remembered).
    with ask(port) as again:
        assert wait_for(lambda: len(compiles.started) == 2, 10)
        compiles.land()
        head = again.recv(65536)
    assert head.startswith(b"HTTP/1.1 200"), head[:200]


def test_a_compile_another_request_waits_for_goes_on_when_one_leaves(held_server) -> None:
    port, compiles = held_server
    leaving, staying = ask(port), ask(port)
    assert wait_for(lambda: len(compiles.started) == 1, 10)
    time.sleep(0.3)  # both are waiting for the one compile
    leaving.close()
    time.sleep(0.5)
    compile_ = compiles.started[0][1]
    assert not compile_.cancelled() and len(compiles.started) == 1
    compiles.land()
    with staying:
        head = staying.recv(65536)
    assert head.startswith(b"HTTP/1.1 200"), head[:200]


def test_a_compile_a_request_was_told_to_retry_goes_on_when_the_others_leave(
    embedded_vocab,
) -> None:
    # The first request's wait ends (its deadline: a 429 that says the compile goes on and
    # its table will be remembered); a second one that joined, then leaves, must not stop
    # the compile the first client is to retry.
    import asyncio

    from gclm.errors import CompilerBusyError
    from gclm.server.engine.constraints import Constraints

    compiles = HeldCompiles(embedded_vocab)
    cache = TableCache(compiles, embedded_vocab.fingerprint)
    constraints = Constraints(embedded_vocab, cache)
    constraint = Constraint.json_schema(SCHEMA)

    async def run() -> None:
        with pytest.raises(CompilerBusyError):
            await constraints.compile(constraint, deadline=time.monotonic() + 0.2)
        leaving = asyncio.ensure_future(constraints.compile(constraint))
        await asyncio.sleep(0.2)
        leaving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leaving

    try:
        asyncio.run(run())
        assert len(compiles.started) == 1 and not compiles.started[0][1].cancelled()
    finally:
        compiles.land()
        constraints.close()
