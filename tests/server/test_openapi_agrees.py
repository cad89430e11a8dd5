"""Bodies the server refuses, the OpenAPI document refuses too (what schemathesis found
documented-valid yet answered 400), and refusals say what is wrong."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI
from harness import http_client
from jsonschema import Draft202012Validator

pytestmark = pytest.mark.anyio

USER = [{"role": "user", "content": "Hi"}]
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
PATHS = {
    "CompletionRequest": "/v1/completions",
    "ChatCompletionRequest": "/v1/chat/completions",
    "ResponsesRequest": "/v1/responses",
}
REFUSED = [
    ("CompletionRequest", {"prompt": ""}),
    ("CompletionRequest", {"prompt": ["a", ""]}),
    ("ChatCompletionRequest", {"messages": [{"role": "tool", "tool_call_id": "c1"}]}),
    ("ChatCompletionRequest", {"messages": [{"role": "user", "content": None}]}),
    ("ResponsesRequest", {"input": "Hi", "reasoning": 0}),
    ("ResponsesRequest", {"input": "Hi", "reasoning": {"effort": "high"}}),
    ("ResponsesRequest", {"input": "Hi", "include": ["message.output_text.logprob"]}),
]
ACCEPTED = [
    ("CompletionRequest", {"prompt": "x", "max_tokens": 2}),
    ("ChatCompletionRequest", {"messages": [*USER, {"role": "assistant", "tool_calls": [CALL]}]}),
    ("ResponsesRequest", {"input": "Hi", "reasoning": {"effort": None}, "max_output_tokens": 2}),
    ("ResponsesRequest", {"input": "Hi", "include": ["reasoning.encrypted_content"]}),
]


def documented(app: FastAPI, model: str, body: dict[str, Any]) -> bool:
    doc = app.openapi()
    schema = {"$ref": f"#/components/schemas/{model}", "components": doc["components"]}
    return Draft202012Validator(schema).is_valid(body)


@pytest.mark.parametrize(("model", "body"), REFUSED)
async def test_refused_by_server_and_document(app: FastAPI, model: str, body) -> None:
    async with http_client(app) as http:
        response = await http.post(PATHS[model], json=body)
    assert response.status_code == 400, response.text
    assert not documented(app, model, body)


@pytest.mark.parametrize(("model", "body"), ACCEPTED)
async def test_accepted_by_server_and_document(app: FastAPI, model: str, body) -> None:
    async with http_client(app) as http:
        response = await http.post(PATHS[model], json=body)
    assert response.status_code == 200, response.text
    assert documented(app, model, body)


async def test_a_nan_temperature_is_told_it_is_not_a_number(app: FastAPI) -> None:
    body = b'{"messages": [{"role": "user", "content": "Hi"}], "temperature": NaN}'
    headers = {"content-type": "application/json"}
    async with http_client(app) as http:
        response = await http.post("/v1/chat/completions", content=body, headers=headers)
    assert response.status_code == 400
    assert "finite number" in response.json()["error"]["message"]
    assert "less than" not in response.json()["error"]["message"]
