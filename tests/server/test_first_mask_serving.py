"""Serving on first masks: a request whose constraint's table is not compiled generates on
its LazyTable (compiler/service/first_mask.py), through the real SDK, on a BatchEngine over a tiny
random Llama with the embedded vocabulary. The whole compile is held back by the test, so
the request cannot have used the table; a request that needs no whole table starts none.
"""

from __future__ import annotations

import asyncio
import json
import re
from concurrent.futures import Future
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from harness import http_client, openai_client

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex
from gclm.compiler.grown.lazy_table import LazyTable
from gclm.compiler.service.cache import TableCache
from gclm.compiler.service.compile_job import Compiling
from gclm.compiler.service.first_mask import lazy_table
from gclm.compiler.whole.byte_dfa import byte_dfa
from gclm.compiler.whole.compile import compile_constraint
from gclm.compiler.whole.tables import CompiledTable
from gclm.errors import CompilerBusyError
from gclm.server.app import create_app
from gclm.server.settings import ServerSettings

pytestmark = pytest.mark.anyio

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["n"],
    "additionalProperties": False,
}
FORMAT: Any = {"type": "json_schema", "json_schema": {"name": "N", "schema": SCHEMA}}
MESSAGES: Any = [{"role": "user", "content": "A number, please."}]


class HeldCompiles:
    """Whole compiles that land when the test says so; FIRST compiles and the first masks of
    a whole compile in flight at once, from the byte DFA (`FIRST_SECONDS` each)."""

    FIRST_SECONDS = 0.25

    def __init__(self, vocab: Any) -> None:
        self.vocab = vocab
        self.pending: dict[str, tuple[Constraint, Future[CompiledTable]]] = {}
        self.started = 0  # whole compiles

    def compile(self, constraint: Constraint) -> Compiling[CompiledTable]:
        future: Compiling[CompiledTable] = Compiling()  # a busy answer's compile: `outcome`
        self.pending[constraint.key_material()] = (constraint, future)
        self.started += 1
        return future

    def land_all(self) -> None:
        for constraint, future in self.pending.values():
            future.set_result(compile_constraint(constraint, self.vocab))
        self.pending.clear()

    # The cache's first_masks source (first_tables.FirstMasksSource):

    def __call__(self, constraint: Constraint) -> Future[LazyTable | None]:
        future: Future[LazyTable | None] = Future()
        future.set_result(self._lazy(constraint))
        return future

    def first_compile(self, constraint: Constraint) -> Future[CompiledTable | LazyTable | None]:
        future: Future[CompiledTable | LazyTable | None] = Future()
        lazy = self._lazy(constraint)
        if lazy is not None:
            lazy.compile_seconds = self.FIRST_SECONDS
        future.set_result(lazy)
        return future

    def _lazy(self, constraint: Constraint) -> LazyTable | None:
        return lazy_table(byte_dfa(to_regex(constraint).regex), self.vocab)


class FirstSource:
    """HeldCompiles as the cache's first_masks (its `compile` is the whole compile's)."""

    grows = False

    def __init__(self, held: HeldCompiles) -> None:
        self.held = held

    def __call__(self, constraint: Constraint) -> Future[LazyTable | None]:
        return self.held(constraint)

    def compile(self, constraint: Constraint) -> Future[CompiledTable | LazyTable | None]:
        return self.held.first_compile(constraint)

    def gauges(self) -> dict[str, float]:
        return {}


@pytest.fixture
def held(embedded_vocab, tiny_batch_engine, tmp_path):
    compiles = HeldCompiles(embedded_vocab)
    cache = TableCache(
        compiles.compile, embedded_vocab.fingerprint, first_masks=FirstSource(compiles)
    )
    # Room for the default budget of a constrained request (512) after the prompt.
    engine = tiny_batch_engine(cache, max_position_embeddings=1024)
    app = create_app(engine, ServerSettings(cache_dir=tmp_path))
    yield app, compiles
    compiles.land_all()
    engine.shutdown()


def first_mask_requests(app: Any) -> float:
    return app.state.serving.metrics.first_masks._value.get()


def compile_waits(app: Any) -> float | None:
    """How many requests gclm_compile_seconds has seen."""
    return app.state.serving.metrics.registry.get_sample_value("gclm_compile_seconds_count")


async def test_a_new_schema_is_served_on_its_byte_dfa_alone(held) -> None:
    app, compiles = held
    async with openai_client(app) as client:
        done = await client.chat.completions.create(
            model="tiny", messages=MESSAGES, response_format=FORMAT, max_tokens=64, seed=1
        )
        jsonschema.validate(json.loads(done.choices[0].message.content or ""), SCHEMA)
        assert done.choices[0].finish_reason == "stop"
        assert first_mask_requests(app) == 1
        # Streamed, and without max_tokens (the default budget from the upper bound).
        stream = await client.chat.completions.create(
            model="tiny", messages=MESSAGES, response_format=FORMAT, stream=True, seed=2
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        jsonschema.validate(json.loads(text), SCHEMA)
        assert first_mask_requests(app) == 2
    assert compiles.started == 0, "no request needed the whole table"
    assert compile_waits(app) == 2


async def test_a_tight_budget_waits_for_the_whole_table(held) -> None:
    """Graceful closure paces a tight budget over the whole table: such a request waits
    for it, and its minimum is the exact one either way. Once compiled, the table answers
    the generous requests too."""
    app, compiles = held
    async with openai_client(app) as client:
        request = asyncio.ensure_future(
            client.chat.completions.create(
                model="tiny", messages=MESSAGES, response_format=FORMAT, max_tokens=12, seed=1
            )
        )
        for _ in range(600):  # until the request asks for the whole table
            if compiles.started or request.done():
                break
            await asyncio.sleep(0.05)
        assert not request.done()
        compiles.land_all()
        done = await asyncio.wait_for(request, 60)
        jsonschema.validate(json.loads(done.choices[0].message.content or ""), SCHEMA)
        assert first_mask_requests(app) == 0
        # One wait, first masks then the whole table: observed once.
        assert compile_waits(app) == 1
        again = await client.chat.completions.create(
            model="tiny", messages=MESSAGES, response_format=FORMAT, max_tokens=64, seed=3
        )
        jsonschema.validate(json.loads(again.choices[0].message.content or ""), SCHEMA)
    assert first_mask_requests(app) == 0
    assert compiles.started == 1


async def test_a_budget_below_the_minimum_is_a_400_naming_it_before_the_table(held) -> None:
    """The LazyTable searches the exact minimum (off the event loop): the whole table's."""
    app, compiles = held
    async with openai_client(app) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model="tiny", messages=MESSAGES, response_format=FORMAT, max_tokens=2
            )
    assert compiles.started == 0, "answered without the whole table"
    minimum = compile_constraint(Constraint.json_schema(SCHEMA), compiles.vocab).min_tokens
    assert f"needs {minimum} tokens" in caught.value.message
    assert caught.value.param == "max_tokens"


async def test_the_first_request_on_a_first_compile_pays_for_it(held, tmp_path) -> None:
    """Its API key is charged the seconds of the byte DFA's compile; a request that then
    finds the LazyTable cached pays nothing."""
    app, compiles = held
    app = keyed_app(app, tmp_path)
    ask: Any = {"model": "tiny", "messages": MESSAGES, "response_format": FORMAT, "max_tokens": 64}
    async with openai_client(app, api_key="sk-dave") as dave, http_client(app) as http:
        await dave.chat.completions.create(**ask)
        async with openai_client(app, api_key="sk-carol") as carol:
            await carol.chat.completions.create(**ask)
        assert await charged(http, "dave") == pytest.approx(compiles.FIRST_SECONDS)
        assert await charged(http, "carol") is None
    assert first_mask_requests(app) == 2 and compiles.started == 0


@pytest.mark.parametrize("background", [False, True])
async def test_first_masks_of_a_whole_compile_pay_for_it_when_it_lands(
    held, tmp_path, background
) -> None:
    """A request served on the first masks of a whole compile in flight (started here by a
    fetch, as a tight request would) is charged the compile's seconds when the table lands,
    also when the pool's deadline passed first (`background`: a 429 to the cache that
    carries the compile going on); a request that then finds the table cached pays
    nothing."""
    app, compiles = held
    app = keyed_app(app, tmp_path)
    cache = app.state.serving.engine.constraints.cache
    cache.fetch(Constraint.json_schema(SCHEMA))  # the whole compile, in flight
    ask: Any = {"model": "tiny", "messages": MESSAGES, "response_format": FORMAT, "max_tokens": 64}
    async with openai_client(app, api_key="sk-dave") as dave, http_client(app) as http:
        await dave.chat.completions.create(**ask)
        assert compiles.pending and first_mask_requests(app) == 1
        constraint, future = next(iter(compiles.pending.values()))
        compiles.pending.clear()
        if background:
            future.set_exception(CompilerBusyError("past its deadline"))
            future = future.outcome
            await asyncio.sleep(0.1)
        assert await charged(http, "dave") is None  # the compile has not ended
        table = compile_constraint(constraint, compiles.vocab)
        future.set_result(table)
        for _ in range(100):  # the charge lands on the event loop after the table
            if await charged(http, "dave") is not None:
                break
            await asyncio.sleep(0.02)
        async with openai_client(app, api_key="sk-carol") as carol:
            await carol.chat.completions.create(**ask)
        assert await charged(http, "dave") == pytest.approx(table.compile_seconds)
        assert await charged(http, "carol") is None
    assert first_mask_requests(app) == 1


def keyed_app(app: Any, tmp_path: Any) -> Any:
    """The same engine behind an app with two API keys, dave and carol."""
    keys = tmp_path / "keys"
    keys.write_text("sk-dave name=dave\nsk-carol name=carol\n")
    return create_app(
        app.state.serving.engine, ServerSettings(cache_dir=tmp_path, api_keys_file=keys)
    )


async def charged(http: httpx.AsyncClient, key: str) -> float | None:
    """`key`'s gclm_key_compile_seconds on /metrics (None: never charged)."""
    metrics = await http.get("/metrics", headers={"authorization": "Bearer sk-carol"})
    found = re.search(rf'^gclm_key_compile_seconds_total{{key="{key}"}} (\S+)$', metrics.text, re.M)
    return float(found.group(1)) if found else None


async def test_a_minimum_past_the_bounded_search_is_the_whole_tables(held, monkeypatch) -> None:
    """Where the exact minimum is past what a request may search on first masks
    (REQUEST_SEARCH_STATES; here none), the budget check waits for the whole table, whose
    minimum the 400 names: the search is not left to run in the server's process."""
    monkeypatch.setattr("gclm.compiler.grown.lazy_table.REQUEST_SEARCH_STATES", 0)
    app, compiles = held
    async with openai_client(app) as client:
        request = asyncio.ensure_future(
            client.chat.completions.create(
                model="tiny", messages=MESSAGES, response_format=FORMAT, max_tokens=2
            )
        )
        for _ in range(600):  # until the request asks for the whole table
            if compiles.started or request.done():
                break
            await asyncio.sleep(0.05)
        assert not request.done() and compiles.started == 1
        compiles.land_all()
        with pytest.raises(openai.BadRequestError) as caught:
            await asyncio.wait_for(request, 60)
    minimum = compile_constraint(Constraint.json_schema(SCHEMA), compiles.vocab).min_tokens
    assert f"needs {minimum} tokens" in caught.value.message


async def test_a_table_not_ready_within_the_wait_is_a_429_and_lands_for_the_retry(held) -> None:
    """A request waits at most the compile timeout for its table, whatever compiles it (the
    pool answers its own at its deadline; this is the wait around everything else): then a
    429 with Retry-After, while the compile goes on and its table answers the retry."""
    app, compiles = held
    app.state.serving.engine.constraints._wait_s = 0.5
    async with openai_client(app) as client:
        with pytest.raises(openai.RateLimitError) as caught:
            await client.chat.completions.create(
                model="tiny", messages=MESSAGES, response_format=FORMAT, max_tokens=12
            )
        assert caught.value.response.headers.get("retry-after")
        assert caught.value.code == "compiler_busy"
        compiles.land_all()
        done = await client.chat.completions.create(
            model="tiny", messages=MESSAGES, response_format=FORMAT, max_tokens=12, seed=1
        )
    jsonschema.validate(json.loads(done.choices[0].message.content or ""), SCHEMA)
    assert compiles.started == 1
