"""Tools beside a JSON `response_format` (chat) or `text.format` (Responses), over the fake
engine: under "auto" the format is the form of a text answer; under "required" or a named
function the output is a call; a bad format is a 400 naming it. (instructor's
Mode.RESPONSES_TOOLS sends text.format and a named tool together.)"""

from __future__ import annotations

import json
import re
from typing import Any

import openai
import pytest
from fake_engine import FakeEngine
from harness import openai_client

from gclm.server.app import create_app
from gclm.server.openai.tools.prompt import OPENER
from gclm.server.settings import ServerSettings

pytestmark = pytest.mark.anyio

ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 20}},
    "required": ["answer"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
CHAT_TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
]
RESPONSES_TOOLS: list[Any] = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
RESPONSE_FORMAT: Any = {"type": "json_schema", "json_schema": {"name": "A", "schema": ANSWER}}
TEXT_FORMAT: Any = {"format": {"type": "json_schema", "name": "A", "schema": ANSWER}}
CALL = OPENER + '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
JSON_SCRIPT = ('{"answer": ', '"Sunny"}')
CALL_SCRIPT = (OPENER, '[{"name": "get_weather", ', '"arguments": {"city": "Paris"}}]')


def app_with(script: tuple[str, ...]) -> tuple[Any, FakeEngine]:
    engine = FakeEngine(lambda request: script)
    return create_app(engine, ServerSettings()), engine


def accepts(engine: FakeEngine, text: str) -> bool:
    """Whether the constraint the engine compiled last takes `text` as a whole output."""
    constraint = engine.compiles[-1]
    assert constraint.kind == "regex"
    return re.fullmatch(constraint.spec, text) is not None


async def test_chat_auto_answers_in_the_format_or_calls() -> None:
    app, engine = app_with(JSON_SCRIPT)
    messages = [{"role": "user", "content": "Hi"}]
    async with openai_client(app) as client:
        done = await client.chat.completions.create(
            model="gclm-fake", messages=messages, tools=CHAT_TOOLS, response_format=RESPONSE_FORMAT
        )
    assert done.choices[0].finish_reason == "stop"
    assert json.loads(done.choices[0].message.content or "") == {"answer": "Sunny"}
    assert accepts(engine, '{"answer": "Sunny"}') and accepts(engine, CALL)
    assert not accepts(engine, "Sunny")  # free text no longer: the format governs text
    assert not accepts(engine, '{"answer": 3}')


async def test_responses_auto_answers_in_the_format_or_calls() -> None:
    app, engine = app_with(JSON_SCRIPT)
    async with openai_client(app) as client:
        text = await client.responses.create(
            model="gclm-fake", input="Hi", tools=RESPONSES_TOOLS, text=TEXT_FORMAT
        )
    assert text.status == "completed" and text.output[0].type == "message"
    assert json.loads(text.output_text) == {"answer": "Sunny"}
    assert accepts(engine, '{"answer": "Sunny"}') and accepts(engine, CALL)
    assert not accepts(engine, "Sunny")

    app, engine = app_with(CALL_SCRIPT)
    async with openai_client(app) as client:
        call = await client.responses.create(
            model="gclm-fake", input="Weather?", tools=RESPONSES_TOOLS, text=TEXT_FORMAT
        )
    [item] = call.output
    assert item.type == "function_call" and json.loads(item.arguments) == {"city": "Paris"}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}])
async def test_responses_forced_call_is_the_tools_constraint(choice: Any) -> None:
    """instructor's Mode.RESPONSES_TOOLS: text.format and a named tool in one request. The
    output is a call, so the constraint is the tools' own, the same as without the format."""
    app, engine = app_with(CALL_SCRIPT)
    async with openai_client(app) as client:
        for text in (TEXT_FORMAT, openai.NOT_GIVEN):
            response = await client.responses.create(
                model="gclm-fake", input="Hi", tools=RESPONSES_TOOLS, tool_choice=choice, text=text
            )
            assert [item.type for item in response.output] == ["function_call"]
    with_format, without = engine.compiles
    assert with_format == without and with_format.kind == "regex"


async def test_tool_choice_none_leaves_the_format_alone() -> None:
    app, engine = app_with(JSON_SCRIPT)
    async with openai_client(app) as client:
        response = await client.responses.create(
            model="gclm-fake",
            input="Hi",
            tools=RESPONSES_TOOLS,
            tool_choice="none",
            text=TEXT_FORMAT,
        )
    assert json.loads(response.output_text) == {"answer": "Sunny"}
    [constraint] = engine.compiles
    assert constraint.kind == "json_schema" and json.loads(constraint.spec) == ANSWER


LOOKAHEAD = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=x)"}}}


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        # A format gclm cannot compile, beside tools: named as the format, whatever choice.
        (
            {"text": {"format": {"type": "json_schema", "name": "A", "schema": LOOKAHEAD}}},
            "text.format.schema",
        ),
        (
            {
                "text": {"format": {"type": "json_schema", "name": "A", "schema": LOOKAHEAD}},
                "tool_choice": "required",
            },
            "text.format.schema",
        ),
        ({"text": {"format": {"type": "json_schema", "name": "A"}}}, "text.format"),
    ],
)
async def test_bad_format_beside_tools_is_named(kwargs: dict[str, Any], param: str) -> None:
    app, engine = app_with(JSON_SCRIPT)
    async with openai_client(app) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(
                model="gclm-fake", input="Hi", tools=RESPONSES_TOOLS, **kwargs
            )
    assert caught.value.param == param
    assert engine.submits == []


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "A", "schema": LOOKAHEAD},
                }
            },
            "response_format.json_schema.schema",
        ),
        # Only a JSON format joins the tools; a regex or a choice still conflicts.
        ({"extra_body": {"guided_regex": "a+"}}, "tools"),
        ({"extra_body": {"structured_outputs": {"choice": ["a"]}}}, "tools"),
    ],
)
async def test_chat_bad_or_conflicting_beside_tools(kwargs: dict[str, Any], param: str) -> None:
    app, engine = app_with(JSON_SCRIPT)
    async with openai_client(app) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model="gclm-fake",
                messages=[{"role": "user", "content": "Hi"}],
                tools=CHAT_TOOLS,
                **kwargs,
            )
    assert caught.value.param == param
    assert engine.submits == []
