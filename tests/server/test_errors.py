"""Every error is OpenAI-shaped: validation, unsupported parameters, auth, queue full."""

from __future__ import annotations

import httpx
import openai
import pytest
from fake_engine import FakeEngine
from fastapi import FastAPI
from harness import API_KEY, BASE_URL, http_client, openai_client

from gclm.errors import InternalError
from gclm.server.app import create_app
from gclm.server.settings import ServerSettings

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "Hi"}]
JSON = {"content-type": "application/json"}


def assert_openai_error(body: dict, param: str | None, code: str | None = None) -> None:
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["param"] == param
    if code is not None:
        assert body["error"]["code"] == code


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"messages": MESSAGES, "temperature": 5}, "temperature", "invalid_parameter"),
        ({"messages": MESSAGES, "n": 0}, "n", "invalid_parameter"),
        ({"messages": MESSAGES, "max_tokens": 0}, "max_tokens", "invalid_parameter"),
        ({"messages": MESSAGES, "stop": [""]}, "stop", "invalid_parameter"),
        ({}, "messages", "missing_required_parameter"),
        ({"messages": []}, "messages", "invalid_parameter"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", None),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content",
            None,
        ),
        (
            {"messages": [{"role": "user", "content": "x", "audio": {}}]},
            "messages[0].audio",
            "unknown_parameter",
        ),
        ({"messages": MESSAGES, "response_format": {"type": "yaml"}}, "response_format.type", None),
    ],
)
async def test_validation_errors_name_the_field(
    app: FastAPI, body: dict, param: str, code: str | None
) -> None:
    async with http_client(app) as http:
        response = await http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert_openai_error(response.json(), param, code)
    assert response.json()["error"]["type"] == "invalid_request_error"


async def test_malformed_json(app: FastAPI) -> None:
    async with http_client(app) as http:
        response = await http.post("/v1/completions", content=b'{"prompt": ', headers=JSON)
    assert response.status_code == 400
    assert_openai_error(response.json(), None, "invalid_json")


async def test_bad_prompt(app: FastAPI) -> None:
    async with http_client(app) as http:
        response = await http.post("/v1/completions", json={"prompt": [1, "a"]})
    assert response.status_code == 400
    assert_openai_error(response.json(), "prompt")


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": {"name": "f"}}, "function_call"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"extra_body": {"top_k": 5}}, "top_k"),
    ],
)
async def test_unsupported_chat_parameters(app: FastAPI, kwargs: dict, param: str) -> None:
    async with openai_client(app) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(model="gclm-fake", messages=MESSAGES, **kwargs)
    assert caught.value.param == param
    assert caught.value.code in ("unsupported_parameter", "unknown_parameter")
    assert param in caught.value.message


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"echo": True}, "echo"),
        ({"best_of": 2}, "best_of"),
        ({"suffix": "end"}, "suffix"),
    ],
)
async def test_unsupported_completion_parameters(app: FastAPI, kwargs: dict, param: str) -> None:
    async with openai_client(app) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.completions.create(model="gclm-fake", prompt="Hi", **kwargs)
    assert caught.value.param == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": MESSAGES, "presence_penalty": 2.5}, "presence_penalty"),
        ({"messages": MESSAGES, "frequency_penalty": -3}, "frequency_penalty"),
        ({"messages": MESSAGES, "repetition_penalty": 0}, "repetition_penalty"),
        ({"messages": MESSAGES, "logit_bias": {"42": 101}}, "logit_bias"),
        ({"messages": MESSAGES, "logit_bias": {"-1": 1}}, "logit_bias"),
        ({"messages": MESSAGES, "logit_bias": {"x": 1}}, "logit_bias"),
        ({"messages": MESSAGES, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs"),
        ({"prompt": "Hi", "logprobs": 21}, "logprobs"),
        ({"prompt": "Hi", "logprobs": -1}, "logprobs"),
    ],
)
async def test_bad_sampling_values(app: FastAPI, body: dict, param: str) -> None:
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    async with http_client(app) as http:
        response = await http.post(path, json=body)
    assert response.status_code == 400
    assert_openai_error(response.json(), param)


async def test_unknown_model_is_a_404(app: FastAPI) -> None:
    async with openai_client(app) as client:
        with pytest.raises(openai.NotFoundError) as caught:
            await client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("gpt-4o")
    assert caught.value.param == "model"
    assert caught.value.code == "model_not_found"
    assert "gclm-fake" in caught.value.message


async def test_unknown_url_is_openai_shaped(app: FastAPI) -> None:
    async with http_client(app) as http:
        missing = await http.get("/v1/nothing")
        wrong_method = await http.get("/v1/completions")
    assert missing.status_code == 404
    assert_openai_error(missing.json(), None, "unknown_url")
    assert wrong_method.status_code == 405
    assert_openai_error(wrong_method.json(), None, "method_not_allowed")


async def test_api_key(engine: FakeEngine, tmp_path) -> None:
    app = create_app(engine, ServerSettings(cache_dir=tmp_path, api_key=API_KEY))
    async with openai_client(app, api_key="sk-wrong") as client:
        with pytest.raises(openai.AuthenticationError) as caught:
            await client.chat.completions.create(model="gclm-fake", messages=MESSAGES)
        with pytest.raises(openai.AuthenticationError):
            await client.models.list()
    assert caught.value.code == "invalid_api_key"
    async with openai_client(app) as client:
        assert (await client.models.list()).data[0].id == "gclm-fake"
    async with http_client(app) as http:
        no_key = await http.post("/v1/completions", content=b"not even json", headers=JSON)
        health = await http.get("/health")
        metrics = await http.get("/metrics")
    # Authentication comes before parsing; /health needs no key, /metrics does.
    assert no_key.status_code == 401
    assert_openai_error(no_key.json(), None, "invalid_api_key")
    assert (health.status_code, metrics.status_code) == (200, 401)
    assert engine.submits == []


async def test_queue_full_is_a_429_with_retry_after(tmp_path) -> None:
    engine = FakeEngine(queue_size=0, retry_after=2.5)
    app = create_app(engine, ServerSettings(cache_dir=tmp_path))
    async with openai_client(app) as client:
        with pytest.raises(openai.RateLimitError) as caught:
            await client.chat.completions.create(model="gclm-fake", messages=MESSAGES)
    response = caught.value.response
    assert response.headers["retry-after"] == "3"
    assert response.headers["retry-after-ms"] == "2500"
    assert caught.value.code == "queue_full"


async def test_a_partly_queued_request_is_withdrawn(tmp_path) -> None:
    engine = FakeEngine(queue_size=2, token_delay=1.0)
    app = create_app(engine, ServerSettings(cache_dir=tmp_path))
    async with openai_client(app) as client:
        with pytest.raises(openai.RateLimitError):
            await client.completions.create(model="gclm-fake", prompt="Hi", n=3)
    assert len(engine.submits) == 2
    assert engine.cancels == [r.request_id for r in engine.submits]


async def test_engine_error_is_a_500(tmp_path) -> None:
    engine = FakeEngine(lambda _: ["a", InternalError("the mask was empty")])
    app = create_app(engine, ServerSettings(cache_dir=tmp_path))
    async with openai_client(app) as client:
        with pytest.raises(openai.InternalServerError) as caught:
            await client.completions.create(model="gclm-fake", prompt="Hi")
    assert "the mask was empty" in caught.value.message
    assert caught.value.type == "server_error"


async def test_unexpected_error_is_a_generic_500(tmp_path) -> None:
    class Broken(FakeEngine):
        def render_chat(self, messages: list[dict]) -> str:
            raise RuntimeError("secret detail")

    app = create_app(Broken(), ServerSettings(cache_dir=tmp_path))
    # httpx's own transport, told to keep the app's exception (Starlette re-raises it).
    transport = httpx.ASGITransport(app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as http:
        response = await http.post("/v1/chat/completions", json={"messages": MESSAGES})
    assert response.status_code == 500
    assert_openai_error(response.json(), None, "internal_error")
    assert response.json()["error"]["type"] == "server_error"
    assert "secret" not in response.text
