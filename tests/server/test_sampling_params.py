"""logprobs, penalties and logit_bias over HTTP (fake engine): OpenAI's shapes, and what
reaches the engine."""

from __future__ import annotations

import json

import pytest
from fake_engine import FREE_TEXT, FakeEngine, fake_logprob
from fastapi import FastAPI
from harness import http_client, openai_client, sse_events

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "Hi"}]
LOGPROBS = [fake_logprob(i) for i in range(len(FREE_TEXT))]


async def test_chat_logprobs(app: FastAPI, engine: FakeEngine) -> None:
    async with openai_client(app) as client:
        completion = await client.chat.completions.create(
            model="gclm-fake", messages=MESSAGES, logprobs=True, top_logprobs=3
        )
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert [t.token for t in logprobs.content] == list(FREE_TEXT)
    assert [t.logprob for t in logprobs.content] == LOGPROBS
    assert [t.bytes for t in logprobs.content] == [list(t.encode()) for t in FREE_TEXT]
    first = logprobs.content[0]
    assert [t.token for t in first.top_logprobs] == ["Grüße", "<alt1>", "<alt2>"]
    assert first.top_logprobs[0].logprob == first.logprob
    assert engine.submits[0].params.logprobs == 3


async def test_chat_logprobs_without_top(app: FastAPI, engine: FakeEngine) -> None:
    async with openai_client(app) as client:
        completion = await client.chat.completions.create(
            model="gclm-fake", messages=MESSAGES, logprobs=True
        )
    content = completion.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and all(t.top_logprobs == [] for t in content)
    assert engine.submits[0].params.logprobs == 0


async def test_chat_stream_logprobs(app: FastAPI) -> None:
    body = {"messages": MESSAGES, "stream": True, "logprobs": True, "top_logprobs": 1}
    async with (
        http_client(app) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        chunks = [json.loads(c) for c in (await sse_events(response))[:-1]]
    deltas = [c["choices"][0] for c in chunks[1:-1]]
    # A token that completes no character still sends its logprob (with empty content).
    assert [d["delta"]["content"] for d in deltas] == list(FREE_TEXT)
    tokens = [t for d in deltas for t in d["logprobs"]["content"]]
    assert [t["logprob"] for t in tokens] == LOGPROBS
    assert all(len(t["top_logprobs"]) == 1 for t in tokens)
    assert chunks[0]["choices"][0]["logprobs"] is None


async def test_completion_logprobs(app: FastAPI, engine: FakeEngine) -> None:
    async with openai_client(app) as client:
        completion = await client.completions.create(model="gclm-fake", prompt="Hi", logprobs=2)
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.tokens == list(FREE_TEXT)
    assert logprobs.token_logprobs == LOGPROBS
    assert logprobs.top_logprobs is not None
    assert logprobs.top_logprobs[0] == {"Grüße": LOGPROBS[0], "<alt1>": LOGPROBS[0] - 1}
    offsets = [sum(len(t) for t in FREE_TEXT[:i]) for i in range(len(FREE_TEXT))]
    assert logprobs.text_offset == offsets
    assert engine.submits[0].params.logprobs == 2


async def test_completion_stream_logprobs(app: FastAPI) -> None:
    body = {"prompt": "Hi", "stream": True, "logprobs": 0}
    async with (
        http_client(app) as http,
        http.stream("POST", "/v1/completions", json=body) as response,
    ):
        chunks = [json.loads(c) for c in (await sse_events(response))[:-1]]
    choices = [c["choices"][0] for c in chunks[:-1]]
    assert [t for c in choices for t in c["logprobs"]["token_logprobs"]] == LOGPROBS
    offsets = [o for c in choices for o in c["logprobs"]["text_offset"]]
    assert offsets == [sum(len(t) for t in FREE_TEXT[:i]) for i in range(len(FREE_TEXT))]
    assert all(c["logprobs"]["top_logprobs"] == [{}] for c in choices)


async def test_no_logprobs_unless_asked(app: FastAPI) -> None:
    async with openai_client(app) as client:
        chat = await client.chat.completions.create(
            model="gclm-fake", messages=MESSAGES, logprobs=False
        )
        completion = await client.completions.create(model="gclm-fake", prompt="Hi")
    assert chat.choices[0].logprobs is None
    assert completion.choices[0].logprobs is None


async def test_penalties_and_bias_reach_the_engine(app: FastAPI, engine: FakeEngine) -> None:
    async with openai_client(app) as client:
        await client.chat.completions.create(
            model="gclm-fake",
            messages=MESSAGES,
            presence_penalty=0.5,
            frequency_penalty=-1.0,
            logit_bias={"42": 5, "7": -100},
            extra_body={"repetition_penalty": 1.3},
        )
        await client.completions.create(
            model="gclm-fake", prompt="Hi", frequency_penalty=2, logit_bias={"3": 1}
        )
    chat, completion = (s.params for s in engine.submits)
    assert (chat.presence_penalty, chat.frequency_penalty, chat.repetition_penalty) == (
        0.5,
        -1.0,
        1.3,
    )
    assert chat.logit_bias == ((7, -100.0), (42, 5.0))
    assert chat.penalized
    assert (completion.frequency_penalty, completion.logit_bias) == (2.0, ((3, 1.0),))


async def test_neutral_values_are_not_penalties(app: FastAPI, engine: FakeEngine) -> None:
    async with http_client(app) as http:
        body = {
            "messages": MESSAGES,
            "presence_penalty": None,
            "frequency_penalty": 0,
            "repetition_penalty": 1,
            "logit_bias": {},
        }
        assert (await http.post("/v1/chat/completions", json=body)).status_code == 200
    assert not engine.submits[0].params.penalized
