"""What an API key protects (every route but /health), several keys from a file, each
with its own limits (429 with Retry-After) and its own metrics (server/http/keys.py)."""

from __future__ import annotations

import asyncio
import re

import openai
import pytest
from fake_engine import FakeEngine
from harness import http_client, openai_client

from gclm.server.app import create_app
from gclm.server.settings import ServerSettings

pytestmark = pytest.mark.anyio

PROTECTED = ["/metrics", "/openapi.json", "/v1/models", "/v1/nothing", "/docs"]
KEYS_FILE = """\
# key        options
sk-alice  name=alice  rpm=2
sk-bob    name=bob    concurrent=1
sk-carol
"""


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def keyed_app(tmp_path, engine: FakeEngine | None = None, **settings):
    keys = tmp_path / "keys"
    keys.write_text(KEYS_FILE)
    settings = ServerSettings(cache_dir=tmp_path, api_keys_file=keys, **settings)
    return create_app(engine or FakeEngine(), settings)


@pytest.mark.parametrize("path", PROTECTED)
async def test_every_route_but_health_needs_the_key(tmp_path, path: str) -> None:
    app = create_app(FakeEngine(), ServerSettings(cache_dir=tmp_path, api_key="sk-one"))
    async with http_client(app) as http:
        without = await http.get(path)
        wrong = await http.get(path, headers=bearer("sk-two"))
        right = await http.get(path, headers=bearer("sk-one"))
        health = await http.get("/health")
    assert (without.status_code, wrong.status_code) == (401, 401)
    assert without.json()["error"]["code"] == "invalid_api_key"
    assert right.status_code == (404 if path in ("/v1/nothing", "/docs") else 200)
    assert health.status_code == 200


async def test_public_metrics_opens_metrics_only(tmp_path) -> None:
    settings = ServerSettings(cache_dir=tmp_path, api_key="sk-one", public_metrics="on")
    async with http_client(create_app(FakeEngine(), settings)) as http:
        metrics = await http.get("/metrics")
        models = await http.get("/v1/models")
    assert (metrics.status_code, models.status_code) == (200, 401)


async def test_every_key_in_the_file_works_and_is_counted_by_name(tmp_path) -> None:
    app = keyed_app(tmp_path)
    async with http_client(app) as http:
        for key in ("sk-alice", "sk-bob", "sk-carol"):
            assert (await http.get("/v1/models", headers=bearer(key))).status_code == 200
        text = (await http.get("/metrics", headers=bearer("sk-carol"))).text
    for name in ("alice", "bob", "key4"):
        assert f'gclm_key_requests_total{{key="{name}",status="200"}} 1.0' in text
    assert "sk-alice" not in text


async def test_requests_per_minute_past_the_limit_get_a_429(tmp_path) -> None:
    async with openai_client(keyed_app(tmp_path), api_key="sk-alice") as client:
        client = client.with_options(max_retries=0)
        await client.models.list()
        await client.models.list()
        with pytest.raises(openai.RateLimitError) as caught:
            await client.models.list()
        other = openai.AsyncOpenAI(
            api_key="sk-carol", base_url=str(client.base_url), http_client=client._client
        )
        assert (await other.models.list()).data  # another key is not limited by alice's
    assert caught.value.code == "rate_limit_exceeded"
    retry_after = int(caught.value.response.headers["retry-after"])
    assert 55 <= retry_after <= 60


async def test_concurrent_requests_past_the_limit_get_a_429(tmp_path) -> None:
    engine = FakeEngine(token_delay=0.05)
    app = keyed_app(tmp_path, engine)
    body = {"prompt": "Hi", "max_tokens": 10}
    async with http_client(app) as http:
        first = asyncio.create_task(
            http.post("/v1/completions", json=body, headers=bearer("sk-bob"))
        )
        await asyncio.sleep(0.1)  # the first is generating
        second = await http.post("/v1/completions", json=body, headers=bearer("sk-bob"))
        assert (await first).status_code == 200
        third = await http.post("/v1/completions", json=body, headers=bearer("sk-bob"))
    assert second.status_code == 429 and second.headers["retry-after"] == "1"
    assert third.status_code == 200


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("sk-a speed=3\n", "unknown option"),
        ("sk-a rpm=x\n", "rpm must be an integer"),
        ("sk-a tokens_per_minute=1.5\n", "tokens_per_minute must be an integer"),
        ("sk-a compile_seconds_per_minute=x\n", "compile_seconds_per_minute must be a number"),
        ("sk-a compile_seconds_per_minute=0\n", "more than 0"),
        ("sk-a compile_seconds_per_minute=nan\n", "more than 0"),
        ("sk-a rpm=0\n", "at least 1"),
        ("# nothing\n", "has no keys"),
        ("sk-a name=x\nsk-b name=x\n", "distinct"),
    ],
)
def test_a_malformed_keys_file_is_refused(tmp_path, text: str, problem: str) -> None:
    keys = tmp_path / "keys"
    keys.write_text(text)
    with pytest.raises(ValueError, match=re.escape(problem)):
        create_app(FakeEngine(), ServerSettings(cache_dir=tmp_path, api_keys_file=keys))
