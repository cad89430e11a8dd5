"""A dead engine is reported, not hidden: GET /health answers 503 with the reason, and every
generating request a 503 in the OpenAI error shape (code `engine_dead`), so that a
supervisor restarts the server."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from fake_engine import FakeEngine
from harness import openai_client

from gclm.errors import EngineDeadError
from gclm.server.app import create_app
from gclm.server.engine.protocol import ErrorEvent, GenerationRequest, SamplingParams
from gclm.server.settings import ServerSettings

MESSAGES = [{"role": "user", "content": "Hi"}]


async def get_health(app) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gclm.test") as http:
        return await http.get("/health")


@pytest.mark.anyio
async def test_a_dead_engine_fails_health_and_requests_with_503(tmp_path) -> None:
    engine = FakeEngine()
    app = create_app(engine, ServerSettings(cache_dir=tmp_path))
    assert (await get_health(app)).status_code == 200

    engine.kill("the GPU fell off the bus")
    health = await get_health(app)
    assert health.status_code == 503
    error = health.json()["error"]
    assert error["code"] == "engine_dead" and error["type"] == "server_error"
    assert "the GPU fell off the bus" in error["message"]
    assert "restarted" in error["message"]

    async with openai_client(app) as client:
        with pytest.raises(openai.InternalServerError) as refused:
            await client.with_options(max_retries=0).chat.completions.create(
                model=engine.model_id, messages=MESSAGES
            )
    assert refused.value.status_code == 503
    assert refused.value.body["code"] == "engine_dead"  # type: ignore[index]
    assert engine.submits == [], "a dead engine is not handed the request"


@pytest.fixture
def tiny_engine(tiny_batch_engine):
    engine = tiny_batch_engine()
    yield engine
    engine.shutdown()


def test_a_batch_engine_whose_thread_dies_fails_health(tiny_engine, tmp_path) -> None:
    """A failed step is survived (the batch fails, serving goes on); a failure of that
    recovery itself kills the thread, and the engine says so."""
    app = create_app(tiny_engine, ServerSettings(cache_dir=tmp_path))
    assert asyncio.run(get_health(app)).status_code == 200

    def broken_step() -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def broken_reset() -> None:
        raise RuntimeError("CUDA error: the device is lost")

    tiny_engine._step = broken_step
    tiny_engine._kv.reset = broken_reset

    async def run() -> list:
        handle = tiny_engine.submit(GenerationRequest([1, 2, 3], SamplingParams(max_tokens=4)))
        async with asyncio.timeout(30):
            return [e async for e in tiny_engine.stream(handle)]

    events = asyncio.run(run())
    assert len(events) == 1 and isinstance(events[0], ErrorEvent)
    assert isinstance(events[0].error, EngineDeadError)
    tiny_engine._thread.join(timeout=10)
    assert not tiny_engine._thread.is_alive()

    health = asyncio.run(get_health(app))
    assert health.status_code == 503
    assert "the device is lost" in health.json()["error"]["message"]

    async def submit_again() -> None:
        tiny_engine.submit(GenerationRequest([1], SamplingParams(max_tokens=2)))

    with pytest.raises(EngineDeadError):
        asyncio.run(submit_again())
