"""Usage comes from one fold over the engine's events: a streamed answer and a collected one
report the same counts (cached tokens once per prompt, as its n choices share it)."""

from __future__ import annotations

import json

import pytest
from fake_engine import FakeEngine
from harness import http_client, sse_events

from gclm.server.app import create_app
from gclm.server.settings import ServerSettings

pytestmark = pytest.mark.anyio

# The fake engine caches like a prefix cache: prompt 0's first choice reuses nothing; every
# later choice reuses the 3 tokens it shares with what came before.
PROMPTS = [[1, 2, 3, 4], [1, 2, 3, 5]]
CACHED = 0 + 3  # choice 0 of each prompt: its n choices share one prompt


async def usage_of(tmp_path, stream: bool) -> dict:
    app = create_app(FakeEngine(), ServerSettings(cache_dir=tmp_path))
    body = {"prompt": PROMPTS, "n": 2, "max_tokens": 3, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    async with http_client(app) as http:
        if not stream:
            response = await http.post("/v1/completions", json=body)
            assert response.status_code == 200
            return response.json()["usage"]
        async with http.stream("POST", "/v1/completions", json=body) as response:
            *chunks, done = await sse_events(response)
    assert done == "[DONE]"
    return json.loads(chunks[-1])["usage"]


async def test_collected_completions_count_cached_tokens_once_per_prompt(tmp_path) -> None:
    usage = await usage_of(tmp_path, stream=False)
    assert usage["prompt_tokens"] == 8
    assert usage["prompt_tokens_details"]["cached_tokens"] == CACHED


async def test_streamed_and_collected_usage_agree(tmp_path) -> None:
    collected = await usage_of(tmp_path / "a", stream=False)
    streamed = await usage_of(tmp_path / "b", stream=True)
    assert streamed == collected
    assert streamed["prompt_tokens_details"]["cached_tokens"] == CACHED
