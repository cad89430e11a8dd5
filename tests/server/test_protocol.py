"""Response shapes and request parameters, through the official openai SDK."""

from __future__ import annotations

import json

import pytest
from fake_engine import FREE_TEXT, FakeEngine
from fastapi import FastAPI
from harness import http_client, openai_client
from pydantic import BaseModel

from gclm.server.app import create_app
from gclm.server.settings import ServerSettings

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "Hi"}]
FREE = "".join(FREE_TEXT)


class Person(BaseModel):
    name: str
    age: int


async def test_chat_completion_shape(app: FastAPI, engine: FakeEngine) -> None:
    async with openai_client(app) as client:
        completion = await client.chat.completions.create(model="gclm-fake", messages=MESSAGES)
    assert completion.id.startswith("chatcmpl-")
    assert completion.object == "chat.completion"
    assert completion.model == "gclm-fake"
    assert isinstance(completion.created, int)
    [choice] = completion.choices
    assert (choice.index, choice.finish_reason, choice.logprobs) == (0, "stop", None)
    assert choice.message.role == "assistant"
    assert choice.message.content == FREE
    prompt_tokens = len(b"<|user|>Hi\n<|assistant|>")
    usage = completion.usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (prompt_tokens, len(FREE_TEXT))
    assert usage.total_tokens == prompt_tokens + len(FREE_TEXT)
    [submitted] = engine.submits
    assert submitted.constraint is None
    assert submitted.request_id == f"{completion.id}-0"


async def test_completion_shape(app: FastAPI) -> None:
    async with openai_client(app) as client:
        completion = await client.completions.create(model="gclm-fake", prompt="Hi")
    assert completion.id.startswith("cmpl-")
    assert completion.object == "text_completion"
    [choice] = completion.choices
    assert (choice.index, choice.text, choice.finish_reason) == (0, FREE, "stop")
    assert completion.usage is not None and completion.usage.prompt_tokens == 2


async def test_nulls_are_sent_explicitly(app: FastAPI) -> None:
    async with http_client(app) as http:
        body = (await http.post("/v1/chat/completions", json={"messages": MESSAGES})).json()
    choice = body["choices"][0]
    assert choice["logprobs"] is None and "logprobs" in choice
    assert choice["message"] == {"role": "assistant", "content": FREE, "refusal": None}


async def test_sampling_parameters_reach_the_engine(app: FastAPI, engine: FakeEngine) -> None:
    async with openai_client(app) as client:
        completion = await client.chat.completions.create(
            model="gclm-fake",
            messages=MESSAGES,
            n=3,
            seed=7,
            temperature=0.5,
            top_p=0.9,
            stop=["END", "\n\n"],
            max_tokens=50,
        )
    assert [c.index for c in completion.choices] == [0, 1, 2]
    assert [r.params.seed for r in engine.submits] == [7, 8, 9]
    params = engine.submits[0].params
    assert (params.temperature, params.top_p, params.max_tokens) == (0.5, 0.9, 50)
    assert params.stop == ("END", "\n\n")
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 3 * len(FREE_TEXT)


async def test_n_without_seed_leaves_seeds_unset(app: FastAPI, engine: FakeEngine) -> None:
    async with openai_client(app) as client:
        await client.completions.create(model="gclm-fake", prompt="Hi", n=2, stop="END")
    assert [r.params.seed for r in engine.submits] == [None, None]
    assert engine.submits[0].params.stop == ("END",)


async def test_prompt_forms(app: FastAPI, engine: FakeEngine) -> None:
    async with openai_client(app) as client:
        ids = await client.completions.create(model="gclm-fake", prompt=[5, 6, 7])
        many = await client.completions.create(model="gclm-fake", prompt=["a", "bc"], n=2)
    assert ids.usage is not None and ids.usage.prompt_tokens == 3
    assert [r.prompt_ids for r in engine.submits] == [[5, 6, 7], [97], [97], [98, 99], [98, 99]]
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    assert many.usage is not None and many.usage.prompt_tokens == 3


async def test_parse_with_a_pydantic_model(app: FastAPI, engine: FakeEngine) -> None:
    async with openai_client(app) as client:
        completion = await client.chat.completions.parse(
            model="gclm-fake", messages=MESSAGES, response_format=Person
        )
    [choice] = completion.choices
    assert choice.finish_reason == "stop"
    assert choice.message.parsed == Person(name="Zoë", age=7)
    [constraint] = engine.compiles
    assert constraint.kind == "json_schema"
    assert json.loads(constraint.spec)["required"] == ["name", "age"]
    [submitted] = engine.submits
    assert submitted.constraint is not None and submitted.constraint.budget_aware


async def test_default_budgets(engine: FakeEngine, tmp_path) -> None:
    settings = ServerSettings(
        cache_dir=tmp_path, default_max_tokens=100, constrained_max_tokens_floor=10
    )
    app = create_app(engine, settings)
    async with openai_client(app) as client:
        await client.completions.create(model="gclm-fake", prompt="x")
        await client.completions.create(
            model="gclm-fake", prompt="x", extra_body={"structured_outputs": {"regex": "a+"}}
        )
        engine.min_tokens = 8
        await client.completions.create(
            model="gclm-fake", prompt="x", extra_body={"structured_outputs": {"regex": "b+"}}
        )
    # Unconstrained: the default. Constrained: max(floor, factor * min_tokens).
    assert [r.params.max_tokens for r in engine.submits] == [100, 10, 16]


async def test_max_completion_tokens_is_a_budget(app: FastAPI, engine: FakeEngine) -> None:
    async with openai_client(app) as client:
        completion = await client.chat.completions.create(
            model="gclm-fake", messages=MESSAGES, max_completion_tokens=2
        )
        same = await client.chat.completions.create(
            model="gclm-fake", messages=MESSAGES, max_tokens=4, max_completion_tokens=4
        )
    assert completion.choices[0].finish_reason == "length"
    assert completion.choices[0].message.content == "Grüße, "
    assert same.choices[0].finish_reason == "length"
    assert [r.params.max_tokens for r in engine.submits] == [2, 4]


async def test_harmless_parameters_are_accepted(app: FastAPI) -> None:
    async with openai_client(app) as client:
        completion = await client.chat.completions.create(
            model="gclm-fake",
            messages=[
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            ],
            user="u-1",
            metadata={"k": "v"},
            store=False,
            frequency_penalty=0,
            presence_penalty=0.0,
            logprobs=False,
            logit_bias={},
            tool_choice="none",
            stream_options={"include_usage": True},
            response_format={"type": "text"},
        )
    assert completion.choices[0].message.content == FREE


async def test_models_and_health(app: FastAPI) -> None:
    async with openai_client(app) as client:
        models = await client.models.list()
        model = await client.models.retrieve("gclm-fake")
    assert [m.id for m in models.data] == ["gclm-fake"]
    assert (model.id, model.object, model.owned_by) == ("gclm-fake", "model", "gclm")
    async with http_client(app) as http:
        health = await http.get("/health")
    assert health.status_code == 200
    assert health.json()["status"] == "ok"


@pytest.mark.anyio
async def test_the_openapi_document_is_served_without_pages_that_load_a_cdn(app) -> None:
    """/docs and /redoc would load FastAPI's scripts from a CDN: they are not served."""
    async with http_client(app) as http:
        assert (await http.get("/openapi.json")).status_code == 200
        for page in ("/docs", "/redoc"):
            response = await http.get(page)
            assert response.status_code == 404 and "cdn" not in response.text.lower()
