"""/metrics: Prometheus text with request, token, compile, rejection and engine metrics."""

from __future__ import annotations

import openai
import pytest
from fake_engine import FakeEngine
from fastapi import FastAPI
from harness import http_client, openai_client

from gclm.server.app import create_app
from gclm.server.engine.protocol import EngineStats
from gclm.server.settings import ServerSettings

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "Hi"}]


async def scrape(app: FastAPI) -> dict[str, float]:
    async with http_client(app) as http:
        response = await http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for line in response.text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


async def test_counters_after_traffic(app: FastAPI, engine: FakeEngine) -> None:
    async with openai_client(app) as client:
        await client.completions.create(model="gclm-fake", prompt="Hi", max_tokens=3)
        await client.completions.create(
            model="gclm-fake", prompt="Hi", extra_body={"guided_regex": "a"}
        )
        await client.completions.create(
            model="gclm-fake", prompt="Hi", extra_body={"guided_regex": "a"}
        )
        with pytest.raises(openai.BadRequestError):
            await client.completions.create(
                model="gclm-fake", prompt="Hi", max_tokens=1, extra_body={"guided_regex": "a"}
            )
    engine.queue_size = 0
    async with openai_client(app) as client:
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(model="gclm-fake", messages=MESSAGES)
    m = await scrape(app)
    assert m['gclm_requests_total{endpoint="/v1/completions",status="200"}'] == 3
    assert m['gclm_requests_total{endpoint="/v1/completions",status="400"}'] == 1
    assert m['gclm_requests_total{endpoint="/v1/chat/completions",status="429"}'] == 1
    assert m['gclm_rejections_total{reason="budget_too_small"}'] == 1
    assert m['gclm_rejections_total{reason="queue_full"}'] == 1
    assert m["gclm_prompt_tokens_total"] == 3 * 2
    assert m["gclm_completion_tokens_total"] == 3 + 4 + 4  # 3 free tokens, 2 x 4 JSON tokens
    assert m["gclm_compile_seconds_count"] == 3
    assert m["gclm_compile_cache_misses_total"] == 1
    assert m["gclm_compile_cache_hits_total"] == 2
    assert m["gclm_queue_depth"] == 0
    assert m["gclm_batch_size"] == 0


async def test_engine_stats_are_read_at_scrape_time(tmp_path) -> None:
    class Busy(FakeEngine):
        def stats(self) -> EngineStats:
            return EngineStats(5, 3, gauges={"kv_blocks_free": 12, "bad-name": 1})

    app = create_app(Busy(), ServerSettings(cache_dir=tmp_path))
    m = await scrape(app)
    assert (m["gclm_queue_depth"], m["gclm_batch_size"]) == (5, 3)
    assert m["gclm_engine_kv_blocks_free"] == 12
    assert m["gclm_compile_cache_hits_total"] == 0  # always exported
    for name in ("gclm_prefill_tokens_total", "gclm_engine_step_seconds_total"):
        assert m[name] == 0
    assert m["gclm_queue_oldest_wait_seconds"] == 0
    assert not any("bad" in name for name in m)


async def test_a_failing_stats_call_does_not_break_the_scrape(tmp_path) -> None:
    class Broken(FakeEngine):
        def stats(self) -> EngineStats:
            raise RuntimeError("busy")

    m = await scrape(create_app(Broken(), ServerSettings(cache_dir=tmp_path)))
    assert "gclm_queue_depth" not in m
    assert m["gclm_prompt_tokens_total"] == 0  # the app's own metrics are still there
