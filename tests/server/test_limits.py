"""Request limits and the adversarial probe's findings, on the fake engine: seeds, strict
numbers, never-admissible requests, body size, deep nesting, short messages, HEAD /health."""

from __future__ import annotations

import json

import openai
import pytest
import torch
from fake_engine import FakeEngine
from fastapi import FastAPI
from harness import http_client, openai_client

from gclm.errors import QUOTE_LIMIT
from gclm.server.app import create_app
from gclm.server.openai.protocol import SEED_MAX, SEED_MIN
from gclm.server.settings import ServerSettings

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "Hi"}]


def chat(**fields: object) -> dict:
    return {"messages": MESSAGES, **fields}


@pytest.mark.parametrize("seed", [1 << 64, SEED_MAX + 1, SEED_MIN - 1, -(1 << 70)])
async def test_seed_out_of_range_is_a_400(app: FastAPI, engine: FakeEngine, seed: int) -> None:
    # The probe: seed >= 2**64 was a 500 from torch.Generator.manual_seed.
    async with http_client(app) as http:
        response = await http.post("/v1/chat/completions", json=chat(seed=seed))
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("seed", "invalid_parameter")
    assert str(SEED_MAX) in error["message"] or str(SEED_MIN) in error["message"]
    assert engine.submits == []


async def test_seed_range_edges_reach_torch_without_overflow(
    app: FastAPI, engine: FakeEngine
) -> None:
    async with http_client(app) as http:
        for seed in (SEED_MIN, SEED_MAX):
            response = await http.post(
                "/v1/completions", json={"prompt": "x", "seed": seed, "n": 64}
            )
            assert response.status_code == 200
    seeds = [r.params.seed for r in engine.submits]
    assert min(seeds) == SEED_MIN and max(seeds) == SEED_MAX + 63
    for seed in (min(seeds), max(seeds)):  # what the engine's Sequence does with them
        torch.Generator().manual_seed(seed)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", "10"),
        ("max_tokens", True),
        ("max_tokens", 10.5),
        ("max_completion_tokens", "10"),
        ("n", "2"),
        ("n", True),
        ("temperature", "0.5"),
        ("temperature", True),
        ("top_p", False),
        ("seed", "7"),
        ("seed", True),
    ],
)
async def test_numbers_are_strict_json_numbers(app: FastAPI, field: str, value: object) -> None:
    async with http_client(app) as http:
        response = await http.post("/v1/chat/completions", json=chat(**{field: value}))
    assert response.status_code == 400
    assert response.json()["error"]["param"] == field


async def test_float_fields_take_json_integers(app: FastAPI, engine: FakeEngine) -> None:
    async with http_client(app) as http:
        response = await http.post("/v1/chat/completions", json=chat(temperature=1, top_p=1))
    assert response.status_code == 200
    assert engine.submits[0].params.temperature == 1.0


async def test_never_admissible_request_is_a_400_not_a_429(tmp_path) -> None:
    # The probe: n=128 above --queue-size got "retry after 1 s", and clients retried forever.
    engine = FakeEngine(queue_size=4)
    app = create_app(engine, ServerSettings(cache_dir=tmp_path, queue_size=4))
    async with openai_client(app) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.completions.create(model="gclm-fake", prompt=["a", "b", "c"], n=2)
        assert caught.value.code == "too_many_choices"
        assert "6 choices" in caught.value.message and "--queue-size" in caught.value.message
        # Four choices fit: they are admitted.
        ok = await client.completions.create(model="gclm-fake", prompt=["a", "b"], n=2)
    assert len(ok.choices) == 4
    assert len(engine.submits) == 4


async def test_head_health(app: FastAPI) -> None:
    async with http_client(app) as http:
        head = await http.head("/health")
        get = await http.get("/health")
    assert head.status_code == 200  # (uvicorn drops a HEAD response's body; e2e checks that)
    assert get.json()["status"] == "ok"


async def test_body_over_the_limit_is_a_413(tmp_path) -> None:
    engine = FakeEngine()
    app = create_app(engine, ServerSettings(cache_dir=tmp_path, max_body_size=1))
    big = chat(user="x" * (1 << 20))
    async with openai_client(app) as client:
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(model="gclm-fake", **big)
    assert caught.value.status_code == 413
    body = caught.value.response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == "request_too_large"
    assert "1 MiB" in body["error"]["message"] and "--max-body-size" in body["error"]["message"]
    assert engine.submits == []


async def test_chunked_body_over_the_limit_is_a_413(tmp_path) -> None:
    # No Content-Length: the limit counts the bytes as they arrive.
    app = create_app(FakeEngine(), ServerSettings(cache_dir=tmp_path, max_body_size=1))
    payload = json.dumps(chat(user="x" * (1 << 20))).encode()

    async def chunks():
        for i in range(0, len(payload), 65536):
            yield payload[i : i + 65536]

    async with http_client(app) as http:
        response = await http.post(
            "/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"}
        )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


async def test_body_under_the_limit_is_served(tmp_path) -> None:
    app = create_app(FakeEngine(), ServerSettings(cache_dir=tmp_path, max_body_size=1))
    async with http_client(app) as http:
        response = await http.post("/v1/chat/completions", json=chat(user="x" * 1000))
    assert response.status_code == 200


async def test_deep_nesting_is_not_called_invalid_json(app: FastAPI) -> None:
    # The probe: a 500-level nested schema was "not valid JSON".
    schema = '{"type":"array","items":' * 500 + "{}" + "}" * 500
    body = '{"messages":[{"role":"user","content":"x"}],"guided_json":' + schema + "}"
    async with http_client(app) as http:
        response = await http.post(
            "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "too_deeply_nested"
    assert "not valid JSON" not in error["message"] and "200 levels" in error["message"]


async def test_deeply_nested_schema_string_is_a_400(app: FastAPI) -> None:
    # The same depth inside a string goes to Python's json module, which recurses.
    schema = '{"type":"array","items":' * 100_000 + "{}" + "}" * 100_000
    async with http_client(app) as http:
        response = await http.post("/v1/chat/completions", json=chat(guided_json=schema))
    assert response.status_code == 400
    assert "too deeply" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "fields",
    [
        {"tools": [{"type": "function", "function": {"name": "f" * 1000}}] * 1000},
        {"logit_bias": {str(i): 1000 for i in range(50_000)}},  # out of range
        {"x" * 100_000: 1},
        {"model": "m" * 100_000},
        {"response_format": {"type": "t" * 100_000}},
    ],
)
async def test_refusals_do_not_echo_whole_values(app: FastAPI, fields: dict) -> None:
    # The probe: a 1 MB `tools` array gave a 1 MB message.
    async with http_client(app) as http:
        response = await http.post("/v1/chat/completions", json=chat(**fields))
    assert response.status_code in (400, 404)
    assert len(response.json()["error"]["message"]) < 3 * QUOTE_LIMIT + 300
    assert len(response.content) < 2000
