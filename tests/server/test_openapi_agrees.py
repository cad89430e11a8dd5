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
TOOL = {"type": "function", "function": {"name": "f"}}
RTOOL = {"type": "function", "name": "f"}
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
    # accepted only at a neutral value
    ("ChatCompletionRequest", {"messages": USER, "moderation": 0}),
    ("CompletionRequest", {"prompt": "x", "suffix": True}),
    ("CompletionRequest", {"prompt": "x", "best_of": 2}),
    ("ResponsesRequest", {"input": "Hi", "background": True}),
    # rules across fields
    ("ChatCompletionRequest", {"messages": [{**USER[0], "tool_calls": [CALL]}]}),
    ("ChatCompletionRequest", {"messages": USER, "tool_choice": "required"}),
    ("ResponsesRequest", {"input": "Hi", "tool_choice": {"type": "function", "name": "f"}}),
    ("ChatCompletionRequest", {"messages": USER, "top_logprobs": 2}),
    ("CompletionRequest", {"prompt": "x", "guided_regex": "a", "guided_choice": ["a"]}),
    ("ChatCompletionRequest", {"messages": USER, "guided_regex": "a", "tools": [TOOL]}),
    ("CompletionRequest", {"prompt": "x", "structured_outputs": {"regex": "a", "choice": ["a"]}}),
    ("CompletionRequest", {"prompt": "x", "structured_outputs": {"budget_aware": True}}),
    ("CompletionRequest", {"prompt": "x", "response_format": {"type": "json_schema"}}),
    ("ResponsesRequest", {"input": "Hi", "text": {"format": {"type": "json_schema"}}}),
    # values
    ("CompletionRequest", {"prompt": "x", "guided_choice": []}),
    ("CompletionRequest", {"prompt": "x", "guided_regex": ""}),
    ("CompletionRequest", {"prompt": "x", "logit_bias": {"a": 1}}),
    ("CompletionRequest", {"prompt": "x", "logit_bias": {"1\n": 1}}),
    ("CompletionRequest", {"prompt": "x", "max_tokens": 2.5}),
    # what this server serves: n within --queue-size, no reasoning model
    ("CompletionRequest", {"prompt": "x", "n": 65}),
    ("ChatCompletionRequest", {"messages": USER, "reasoning_effort": "high"}),
    ("ChatCompletionRequest", {"messages": USER, "thinking_token_budget": 10}),
]
ACCEPTED = [
    ("CompletionRequest", {"prompt": "x", "max_tokens": 2}),
    ("ChatCompletionRequest", {"messages": [*USER, {"role": "assistant", "tool_calls": [CALL]}]}),
    ("ResponsesRequest", {"input": "Hi", "reasoning": {"effort": None}, "max_output_tokens": 2}),
    ("ResponsesRequest", {"input": "Hi", "include": ["reasoning.encrypted_content"]}),
    # JSON integers written as 5.0 are integers
    ("CompletionRequest", {"prompt": [1.0, 2], "max_tokens": 2.0, "n": 2.0, "seed": 3.0}),
    # neutral values of unimplemented parameters
    ("CompletionRequest", {"prompt": "x", "echo": False, "best_of": 1.0, "suffix": ""}),
    ("ChatCompletionRequest", {"messages": USER, "modalities": ["text"], "functions": []}),
    # one constraint: a text response_format and tool_choice "none" set none
    (
        "ChatCompletionRequest",
        {
            "messages": USER,
            "response_format": {"type": "text"},
            "tools": [TOOL],
            "tool_choice": "none",
            "guided_regex": "a",
        },
    ),
    ("CompletionRequest", {"prompt": "x", "logit_bias": {"17": -100}, "n": 64}),
    # a JSON format beside tools: the form of a text answer (tools/prompt.py)
    (
        "ResponsesRequest",
        {"input": "Hi", "text": {"format": {"type": "json_object"}}, "tools": [RTOOL]},
    ),
    (
        "ChatCompletionRequest",
        {"messages": USER, "response_format": {"type": "json_object"}, "tools": [TOOL]},
    ),
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


async def test_the_served_model_is_the_one_documented(app: FastAPI) -> None:
    body = {"prompt": "x", "model": "other"}
    async with http_client(app) as http:
        response = await http.post("/v1/completions", json=body)
    assert response.status_code == 404
    assert not documented(app, "CompletionRequest", body)
    assert documented(app, "CompletionRequest", {"prompt": "x", "model": "gclm-fake"})


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
