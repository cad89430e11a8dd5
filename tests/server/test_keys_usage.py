"""Per-key limits on what requests use, charged after the fact: tokens a minute and compile
seconds a minute (server/http/keys.py), each a 429 with Retry-After once spent, and each
counted per key in /metrics."""

from __future__ import annotations

import re

import openai
import pytest
from fake_engine import FakeEngine
from harness import http_client, openai_client

from gclm.errors import CompileLimitError
from gclm.server.app import create_app
from gclm.server.http.keys import WINDOW_S, Window
from gclm.server.settings import ServerSettings

pytestmark = pytest.mark.anyio

KEYS_FILE = """\
sk-dave   name=dave   tokens_per_minute=20
sk-eve    name=eve    compile_seconds_per_minute=1
sk-carol  name=carol
"""


def keyed_app(tmp_path, engine: FakeEngine):
    keys = tmp_path / "keys"
    keys.write_text(KEYS_FILE)
    return create_app(engine, ServerSettings(cache_dir=tmp_path, api_keys_file=keys))


def sample(metrics: str, name: str, key: str) -> float | None:
    found = re.search(rf'^{name}{{key="{key}"}} (\S+)$', metrics, re.MULTILINE)
    return float(found.group(1)) if found else None


def test_the_wait_is_until_enough_of_the_window_has_passed() -> None:
    window = Window()
    window.add(0.0, 5)
    window.add(10.0, 5)
    assert window.wait(20.0, 11) is None  # 10 spent, under 11
    assert window.wait(20.0, 8) == 40.0  # under 8 once the first 5 leave, at 60 s
    assert window.wait(20.0, 3) == 50.0  # under 3 only once both leave
    assert window.wait(WINDOW_S + 10.0, 3) is None and window.total == 0


async def test_tokens_past_the_limit_get_a_429_until_the_window_passes(tmp_path) -> None:
    app = keyed_app(tmp_path, FakeEngine())
    async with openai_client(app, api_key="sk-dave") as client:
        first = await client.completions.create(model="gclm-fake", prompt="Hello", max_tokens=8)
        assert first.usage.total_tokens < 20  # under the limit: the next one is let in
        stream = await client.completions.create(
            model="gclm-fake",
            prompt="Hello again",
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
        streamed = [chunk.usage async for chunk in stream if chunk.usage is not None]
        with pytest.raises(openai.RateLimitError) as caught:
            await client.completions.create(model="gclm-fake", prompt="x", max_tokens=1)
        other = openai.AsyncOpenAI(
            api_key="sk-carol", base_url=str(client.base_url), http_client=client._client
        )
        assert (await other.completions.create(model="gclm-fake", prompt="x")).choices
        metrics = (
            await other._client.get("/metrics", headers={"authorization": "Bearer sk-carol"})
        ).text
    spent = first.usage.total_tokens + streamed[0].total_tokens
    assert spent >= 20
    assert caught.value.code == "rate_limit_exceeded"
    assert "20 tokens a minute" in caught.value.message
    assert 55 <= int(caught.value.response.headers["retry-after"]) <= 60
    assert sample(metrics, "gclm_key_tokens_total", "dave") == spent
    assert 'gclm_key_requests_total{key="dave",status="429"} 1.0' in metrics


async def test_compile_seconds_are_charged_to_the_key_that_compiled(tmp_path) -> None:
    app = keyed_app(tmp_path, FakeEngine(compile_seconds=0.8))
    body = {"prompt": "Hi", "max_tokens": 5}

    def as_(key: str) -> dict[str, str]:
        return {"authorization": f"Bearer {key}"}

    async with http_client(app) as http:
        # carol compiles "a+": hers to pay; eve then finds it cached and pays nothing.
        for key in ("sk-carol", "sk-eve", "sk-eve"):
            ok = await http.post(
                "/v1/completions", json={**body, "guided_regex": "a+"}, headers=as_(key)
            )
            assert ok.status_code == 200, ok.text
        # eve's own compiles: 0.8 s is under her 1 s, 1.6 s is not.
        for regex in ("b+", "c+"):
            ok = await http.post(
                "/v1/completions", json={**body, "guided_regex": regex}, headers=as_("sk-eve")
            )
            assert ok.status_code == 200, ok.text
        refused = await http.post("/v1/completions", json=body, headers=as_("sk-eve"))
        metrics = (await http.get("/metrics", headers=as_("sk-carol"))).text
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert (
        error["code"] == "rate_limit_exceeded"
        and "1 s of compile time a minute" in error["message"]
    )
    assert 55 <= int(refused.headers["retry-after"]) <= 60
    assert sample(metrics, "gclm_key_compile_seconds_total", "carol") == pytest.approx(0.8)
    assert sample(metrics, "gclm_key_compile_seconds_total", "eve") == pytest.approx(1.6)


async def test_a_compile_stopped_at_its_cpu_limit_is_charged_once(tmp_path) -> None:
    # What the compile pool answers for a constraint past --compile-cpu-limit; the table
    # cache then re-raises that one error for the same constraint (compiler/service/cache.py).
    stopped = CompileLimitError("Compiling used more than 1.2 s of CPU.", compile_seconds=1.2)
    engine = FakeEngine()

    async def too_costly(constraint, *, first_mask=False, deadline=None):
        raise stopped

    engine.compile = too_costly  # type: ignore[method-assign]
    app = keyed_app(tmp_path, engine)
    body = {"prompt": "Hi", "max_tokens": 5, "guided_regex": "a+"}
    eve = {"authorization": "Bearer sk-eve"}
    async with http_client(app) as http:
        failed = await http.post("/v1/completions", json=body, headers=eve)
        refused = await http.post("/v1/completions", json=body, headers=eve)
        carol = {"authorization": "Bearer sk-carol"}
        cached = await http.post("/v1/completions", json=body, headers=carol)
        metrics = (await http.get("/metrics", headers=carol)).text
    assert failed.json()["error"]["code"] == "compile_limit"
    assert refused.status_code == 429  # 1.2 s spent of eve's 1 s a minute
    assert cached.json()["error"]["code"] == "compile_limit"  # the cached failure: free
    assert sample(metrics, "gclm_key_compile_seconds_total", "eve") == pytest.approx(1.2)
    assert sample(metrics, "gclm_key_compile_seconds_total", "carol") is None
