"""POST /v1/responses against the fake engine: shapes, events, text.format and the 400s."""

from __future__ import annotations

import json

import openai
import pytest
from fake_engine import FREE_TEXT, JSON_TEXT, FakeEngine, fake_logprob
from fastapi import FastAPI
from harness import http_client, openai_client
from pydantic import BaseModel

from gclm.compiler.front.constraint import Constraint
from gclm.server.app import create_app
from gclm.server.settings import ServerSettings

pytestmark = pytest.mark.anyio

FREE = "".join(FREE_TEXT)
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


class Person(BaseModel):
    name: str
    age: int


async def test_create_shape(app: FastAPI, engine: FakeEngine) -> None:
    async with openai_client(app) as client:
        response = await client.responses.create(
            model="gclm-fake", input="Hi", instructions="Be brief.", temperature=0.5
        )
    assert response.id.startswith("resp_")
    assert (response.object, response.status, response.model) == (
        "response",
        "completed",
        "gclm-fake",
    )
    assert response.incomplete_details is None
    assert response.output_text == FREE
    [message] = response.output
    assert (message.type, message.role, message.status) == ("message", "assistant", "completed")
    assert message.id.startswith("msg_")
    [part] = message.content
    assert part.type == "output_text" and part.text == FREE
    prompt = b"<|system|>Be brief.\n<|user|>Hi\n<|assistant|>"
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (
        len(prompt),
        len(FREE_TEXT),
    )
    assert response.usage.total_tokens == len(prompt) + len(FREE_TEXT)
    # Required by the openai SDK's types (3.63): gclm's prefix reuse writes nothing to pay.
    details = response.usage.input_tokens_details
    assert (details.cached_tokens, details.cache_write_tokens) == (0, 0)
    assert (response.instructions, response.temperature) == ("Be brief.", 0.5)
    [submitted] = engine.submits
    assert submitted.prompt_ids == list(prompt)
    assert submitted.constraint is None
    assert submitted.params.temperature == 0.5


async def test_input_items(app: FastAPI, engine: FakeEngine) -> None:
    items = [
        {"role": "developer", "content": "Rules."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "A"}]},
        {
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "B", "annotations": []}],
        },
        {"role": "user", "content": "C"},
    ]
    async with openai_client(app) as client:
        await client.responses.create(model="gclm-fake", input=items)
    [submitted] = engine.submits
    expected = "<|system|>Rules.\n<|user|>A\n<|assistant|>B\n<|user|>C\n<|assistant|>"
    assert bytes(submitted.prompt_ids).decode() == expected


async def test_max_output_tokens_makes_free_text_incomplete(
    app: FastAPI, engine: FakeEngine
) -> None:
    async with openai_client(app) as client:
        response = await client.responses.create(model="gclm-fake", input="Hi", max_output_tokens=2)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete"
    assert response.output_text == "Grüße, "
    assert engine.submits[0].params.max_tokens == 2


async def test_json_schema_format(app: FastAPI, engine: FakeEngine) -> None:
    text = {"format": {"type": "json_schema", "name": "p", "schema": SCHEMA, "strict": True}}
    async with openai_client(app) as client:
        response = await client.responses.create(model="gclm-fake", input="Hi", text=text)
    assert response.output_text == "".join(JSON_TEXT)
    assert engine.compiles == [Constraint.json_schema(SCHEMA)]
    assert response.text is not None and response.text.format is not None
    assert response.text.format.type == "json_schema"


async def test_json_object_and_text_formats(app: FastAPI, engine: FakeEngine) -> None:
    async with openai_client(app) as client:
        await client.responses.create(
            model="gclm-fake", input="Hi", text={"format": {"type": "json_object"}}
        )
        await client.responses.create(
            model="gclm-fake", input="Hi", text={"format": {"type": "text"}}
        )
    assert engine.compiles == [Constraint.json_object()]
    assert engine.submits[1].constraint is None


async def test_parse_returns_the_model(app: FastAPI) -> None:
    engine = FakeEngine(lambda r: ('{"name": "Zoë", ', '"age": 7}'))
    app = create_app(engine, ServerSettings())
    async with openai_client(app) as client:
        response = await client.responses.parse(
            model="gclm-fake", input="Who?", text_format=Person, max_output_tokens=16
        )
    assert response.status == "completed"
    assert response.output_parsed == Person(name="Zoë", age=7)
    [constraint] = engine.compiles
    assert constraint.kind == "json_schema"
    assert json.loads(constraint.spec)["required"] == ["name", "age"]


async def test_budget_error_names_max_output_tokens(app: FastAPI) -> None:
    # The fake's tables need 3 tokens.
    async with openai_client(app) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.parse(
                model="gclm-fake", input="Who?", text_format=Person, max_output_tokens=2
            )
    assert caught.value.param == "max_output_tokens"
    assert caught.value.code == "budget_too_small"
    assert "max_output_tokens" in caught.value.message


async def test_stream_event_sequence(app: FastAPI) -> None:
    async with http_client(app) as http:
        body = {"input": "Hi", "stream": True}
        async with http.stream("POST", "/v1/responses", json=body) as response:
            assert response.status_code == 200
            lines = [line async for line in response.aiter_lines() if line]
    assert not any(line == "data: [DONE]" for line in lines)
    kinds = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    data = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data:")]
    assert kinds == [d["type"] for d in data]
    deltas = [t for t in FREE_TEXT if t]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(deltas),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [d["sequence_number"] for d in data] == list(range(len(data)))
    assert data[0]["response"]["status"] == "in_progress"
    assert [d["delta"] for d in data if d["type"] == "response.output_text.delta"] == deltas
    item_id = data[2]["item"]["id"]
    assert all(d.get("item_id", item_id) == item_id for d in data)
    done = data[-1]["response"]
    assert done["status"] == "completed"
    assert done["output"][0]["content"][0]["text"] == FREE
    assert done["usage"]["output_tokens"] == len(FREE_TEXT)
    assert done["id"] == data[0]["response"]["id"]


async def test_sdk_stream_helper(app: FastAPI) -> None:
    engine = FakeEngine(lambda r: ('{"name": "Zoë", ', '"age": 7}'))
    app = create_app(engine, ServerSettings())
    async with openai_client(app) as client:
        async with client.responses.stream(
            model="gclm-fake", input="Who?", text_format=Person
        ) as stream:
            deltas = [e.delta async for e in stream if e.type == "response.output_text.delta"]
            final = await stream.get_final_response()
    assert "".join(deltas) == '{"name": "Zoë", "age": 7}'
    assert final.status == "completed"
    assert final.output_parsed == Person(name="Zoë", age=7)


async def test_stream_incomplete(app: FastAPI) -> None:
    async with openai_client(app) as client:
        stream = await client.responses.create(
            model="gclm-fake", input="Hi", max_output_tokens=2, stream=True
        )
        events = [event async for event in stream]
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


async def test_stream_error_event() -> None:
    engine = FakeEngine(lambda r: ("a", RuntimeError("boom")))
    app = create_app(engine, ServerSettings())
    async with http_client(app) as http:
        body = {"input": "Hi", "stream": True}
        async with http.stream("POST", "/v1/responses", json=body) as response:
            lines = [line async for line in response.aiter_lines() if line]
    assert lines[-2] == "event: error"
    error = json.loads(lines[-1].removeprefix("data: "))
    assert error["type"] == "error" and error["code"] == "internal_error"
    assert "boom" not in error["message"]  # a non-gclm error's details stay in the log


async def test_logprobs_when_included(app: FastAPI, engine: FakeEngine) -> None:
    async with openai_client(app) as client:
        response = await client.responses.create(
            model="gclm-fake",
            input="Hi",
            include=["message.output_text.logprobs"],
            top_logprobs=2,
        )
        plain = await client.responses.create(model="gclm-fake", input="Hi", top_logprobs=2)
    logprobs = response.output[0].content[0].logprobs
    assert logprobs is not None
    assert [lp.token for lp in logprobs] == list(FREE_TEXT)
    assert [lp.logprob for lp in logprobs] == [fake_logprob(i) for i in range(len(FREE_TEXT))]
    assert all(len(lp.top_logprobs) == 2 for lp in logprobs)
    assert logprobs[0].bytes == list("Grüße".encode())
    assert plain.output[0].content[0].logprobs == []
    assert [s.params.logprobs for s in engine.submits] == [2, None]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "Hi", "previous_response_id": ""}, "previous_response_id"),
        ({"input": "Hi", "previous_response_id": 7}, "previous_response_id"),
        ({"input": "Hi", "conversation": "conv_1"}, "conversation"),
        ({"input": "Hi", "background": True}, "background"),
        ({"input": "Hi", "tools": [{"type": "web_search"}]}, "tools"),
        ({"input": "Hi", "tool_choice": "required"}, "tool_choice"),
        ({"input": "Hi", "reasoning": {"effort": "high"}}, "reasoning"),
        ({"input": "Hi", "prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"input": "Hi", "n": 2}, "n"),
        ({"input": "Hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "Hi", "top_logprobs": 21}, "top_logprobs"),
        ({"input": "Hi", "text": {"verbosity": "low"}}, "text.verbosity"),
        ({"input": "Hi", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"input": "Hi", "text": {"format": {"type": "json_schema"}}}, "text.format"),
        (
            {"input": "Hi", "text": {"format": {"type": "json_schema", "schema": 3}}},
            "text.format.schema",
        ),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input[0].function_call.call_id"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input[0].message.content",
        ),
        ({"input": []}, "input"),
        ({}, "input"),
    ],
)
async def test_refusals_name_the_parameter(app: FastAPI, body: dict, param: str) -> None:
    async with http_client(app) as http:
        response = await http.post("/v1/responses", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


async def test_schema_error_names_text_format(app: FastAPI) -> None:
    fmt = {"type": "json_schema", "name": "x", "schema": {"type": "strange"}}
    async with http_client(app) as http:
        response = await http.post("/v1/responses", json={"input": "Hi", "text": {"format": fmt}})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "text.format"  # as chat names response_format


async def test_fields_that_change_nothing_are_accepted(app: FastAPI) -> None:
    async with openai_client(app) as client:
        response = await client.responses.create(
            model="gclm-fake",
            input="Hi",
            store=True,
            metadata={"k": "v"},
            user="u",
            truncation="disabled",
            tool_choice="auto",
            parallel_tool_calls=True,
            include=["reasoning.encrypted_content"],
        )
    assert response.status == "completed"
    assert response.model_extra is not None and response.model_extra["store"] is True


async def test_unknown_model_is_a_404(app: FastAPI) -> None:
    async with openai_client(app) as client:
        with pytest.raises(openai.NotFoundError) as caught:
            await client.responses.create(model="gpt-5", input="Hi")
    assert caught.value.code == "model_not_found"
