"""Server-Sent Events: chunk order, n > 1, errors mid-stream, and cancelling on disconnect."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from fake_engine import FREE_TEXT, FakeEngine
from fastapi import FastAPI
from harness import http_client, openai_client, sse_events
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from gclm.errors import InternalError
from gclm.server.app import create_app
from gclm.server.settings import ServerSettings

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "Hi"}]


async def post_stream(app: FastAPI, path: str, body: dict) -> list[str]:
    async with http_client(app) as http, http.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return await sse_events(response)


async def test_chat_stream_order(app: FastAPI) -> None:
    body = {"messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}}
    *chunks, done = await post_stream(app, "/v1/chat/completions", body)
    assert done == "[DONE]"
    parsed = [json.loads(c) for c in chunks]
    assert len({c["id"] for c in parsed}) == 1
    assert all(c["object"] == "chat.completion.chunk" for c in parsed)
    role, *deltas, finish, usage = parsed
    assert role["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    # Multi-byte text arrives whole; the empty token sends no chunk.
    assert [d["choices"][0]["delta"] for d in deltas] == [{"content": t} for t in FREE_TEXT if t]
    assert finish["choices"] == [
        {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    ]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == len(FREE_TEXT)


async def test_completion_stream_order(app: FastAPI) -> None:
    body = {"prompt": "Hi", "stream": True, "stream_options": {"include_usage": True}}
    *chunks, done = await post_stream(app, "/v1/completions", body)
    parsed = [json.loads(c) for c in chunks]
    assert done == "[DONE]"
    assert all(c["object"] == "text_completion" and c["id"].startswith("cmpl-") for c in parsed)
    *deltas, finish, usage = parsed
    assert "".join(d["choices"][0]["text"] for d in deltas) == "".join(FREE_TEXT)
    assert finish["choices"][0]["finish_reason"] == "stop"
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens"] == 2


async def test_no_usage_chunk_unless_asked(app: FastAPI) -> None:
    *chunks, done = await post_stream(app, "/v1/completions", {"prompt": "Hi", "stream": True})
    assert done == "[DONE]"
    assert json.loads(chunks[-1])["choices"][0]["finish_reason"] == "stop"
    assert all("usage" not in json.loads(c) or json.loads(c)["usage"] is None for c in chunks)


async def test_sdk_stream(app: FastAPI) -> None:
    async with openai_client(app) as client:
        stream = await client.chat.completions.create(
            model="gclm-fake",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "".join(FREE_TEXT)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(FREE_TEXT)


async def test_n_choices_interleave(tmp_path) -> None:
    engine = FakeEngine(lambda r: [f"{r.params.seed}:{k};" for k in range(3)], token_delay=0.002)
    app = create_app(engine, ServerSettings(cache_dir=tmp_path))
    async with openai_client(app) as client:
        stream = await client.chat.completions.create(
            model="gclm-fake", messages=MESSAGES, stream=True, n=3, seed=10
        )
        chunks = [chunk async for chunk in stream]
    texts: dict[int, str] = {0: "", 1: "", 2: ""}
    finished = []
    for chunk in chunks:
        [choice] = chunk.choices
        texts[choice.index] += choice.delta.content or ""
        if choice.finish_reason:
            finished.append(choice.index)
    assert texts == {i: f"{10 + i}:0;{10 + i}:1;{10 + i}:2;" for i in range(3)}
    assert sorted(finished) == [0, 1, 2]
    indices = [c.choices[0].index for c in chunks[3:]]  # after the three role chunks
    assert indices != sorted(indices)  # interleaved, not one choice after another


async def test_length_finish(app: FastAPI) -> None:
    *chunks, _ = await post_stream(
        app, "/v1/completions", {"prompt": "Hi", "stream": True, "max_tokens": 2}
    )
    assert json.loads(chunks[-1])["choices"][0]["finish_reason"] == "length"


async def test_error_mid_stream(tmp_path) -> None:
    def script(request):  # type: ignore[no-untyped-def]
        if request.params.seed == 1:
            return ["a", InternalError("the mask was empty")]
        return ["b"] * 100

    engine = FakeEngine(script, token_delay=0.002)
    app = create_app(engine, ServerSettings(cache_dir=tmp_path))
    body = {"prompt": "Hi", "stream": True, "n": 2, "seed": 0}
    *chunks, done = await post_stream(app, "/v1/completions", body)
    assert done == "[DONE]"
    error = json.loads(chunks[-1])["error"]
    assert error["message"] == "the mask was empty"
    assert error["type"] == "server_error"
    assert engine.cancels == [engine.submits[0].request_id]  # the healthy choice is stopped


async def test_sdk_raises_on_error_event(tmp_path) -> None:
    engine = FakeEngine(lambda _: ["a", InternalError("the mask was empty")])
    app = create_app(engine, ServerSettings(cache_dir=tmp_path))
    async with openai_client(app) as client:
        stream = await client.completions.create(model="gclm-fake", prompt="Hi", stream=True)
        with pytest.raises(openai.APIError, match="the mask was empty"):
            async for _ in stream:
                pass


async def test_closing_a_stream_cancels_generation(tmp_path) -> None:
    engine = FakeEngine(lambda _: ["x"] * 1000, token_delay=0.005)
    app = create_app(engine, ServerSettings(cache_dir=tmp_path))
    async with openai_client(app) as client:
        stream = await client.chat.completions.create(
            model="gclm-fake", messages=MESSAGES, stream=True, n=2
        )
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == 4:
                break
        await stream.close()
    cancels = await engine.wait_for_cancels(2)
    assert sorted(cancels) == sorted(r.request_id for r in engine.submits)
    async with http_client(app) as http:
        metrics = (await http.get("/metrics")).text
    assert "gclm_client_disconnects_total 1.0" in metrics


async def test_disconnect_while_waiting_cancels_generation(tmp_path) -> None:
    engine = FakeEngine(lambda _: ["x"] * 1000, token_delay=0.005)
    app = create_app(engine, ServerSettings(cache_dir=tmp_path))
    async with openai_client(app) as client:
        task = asyncio.create_task(
            client.chat.completions.create(model="gclm-fake", messages=MESSAGES)
        )
        while not engine.submits:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert await engine.wait_for_cancels(1) == [engine.submits[0].request_id]
    assert engine.running == []


@hypothesis_settings(max_examples=25, deadline=None)
@given(tokens=st.lists(st.text(max_size=4), max_size=8))
def test_streamed_text_is_the_generated_text(tokens: list[str]) -> None:
    """For any token texts, the deltas add up to exactly the non-streamed content."""
    engine = FakeEngine(lambda _: tokens)
    app = create_app(engine, ServerSettings())

    async def run() -> tuple[str, str]:
        async with openai_client(app) as client:
            whole = await client.chat.completions.create(model="gclm-fake", messages=MESSAGES)
            stream = await client.chat.completions.create(
                model="gclm-fake", messages=MESSAGES, stream=True
            )
            parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        return whole.choices[0].message.content or "", "".join(parts)

    whole, streamed = asyncio.run(run())
    assert whole == streamed == "".join(tokens)
