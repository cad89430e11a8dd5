"""tool_choice `allowed_tools` on chat and on the Responses API, through the openai SDK over
the fake engine: the constraint is built over the allowed tools only ("required": a call to
one of them; "auto": text too), every tool stays described in the prompt."""

from __future__ import annotations

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

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
NAMES = ("get_weather", "get_time", "search")
CHAT_TOOLS: Any = [{"type": "function", "function": {"name": n, "parameters": CITY}} for n in NAMES]
RESPONSES_TOOLS: Any = [{"type": "function", "name": n, "parameters": CITY} for n in NAMES]
CALL = (OPENER, '[{"name": "get_time", "arguments": {"city": "Paris"}}]')


def app_with(script: tuple[str, ...]) -> tuple[Any, FakeEngine]:
    engine = FakeEngine(lambda request: script)
    return create_app(engine, ServerSettings()), engine


def chat_choice(mode: str, *names: str) -> Any:
    tools = [{"type": "function", "function": {"name": n}} for n in names]
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": tools}}


def responses_choice(mode: str, *names: str) -> Any:
    tools = [{"type": "function", "name": n} for n in names]
    return {"type": "allowed_tools", "mode": mode, "tools": tools}


def accepts(engine: FakeEngine, text: str) -> bool:
    [constraint] = engine.compiles
    return re.fullmatch(constraint.spec, text) is not None


def call(name: str) -> str:
    return OPENER + f'[{{"name": "{name}", "arguments": {{"city": "Paris"}}}}]'


async def test_chat_required_calls_one_of_the_allowed() -> None:
    app, engine = app_with(CALL)
    async with openai_client(app) as client:
        completion = await client.chat.completions.create(
            model="gclm-fake",
            messages=[{"role": "user", "content": "Time?"}],
            tools=CHAT_TOOLS,
            tool_choice=chat_choice("required", "get_weather", "get_time"),
        )
    [tool_call] = completion.choices[0].message.tool_calls or []
    assert tool_call.function.name == "get_time"  # type: ignore[union-attr]
    assert completion.choices[0].finish_reason == "tool_calls"
    assert accepts(engine, call("get_weather")) and accepts(engine, call("get_time"))
    assert not accepts(engine, call("search"))  # listed, not allowed
    assert not accepts(engine, "It is noon.")  # required: no text
    # Every tool is still described; the rule names the allowed ones.
    prompt = bytes(engine.submits[0].prompt_ids).decode()
    assert all(f'"name": "{n}"' in prompt for n in NAMES)
    assert "Call one or more of these now, and no other: get_weather, get_time." in prompt


async def test_chat_auto_allows_text_too() -> None:
    app, engine = app_with(("It is ", "noon."))
    async with openai_client(app) as client:
        completion = await client.chat.completions.create(
            model="gclm-fake",
            messages=[{"role": "user", "content": "Time?"}],
            tools=CHAT_TOOLS,
            tool_choice=chat_choice("auto", "get_time"),
        )
    assert completion.choices[0].message.content == "It is noon."
    assert accepts(engine, "It is noon.") and accepts(engine, call("get_time"))
    assert not accepts(engine, call("get_weather"))


async def test_responses_required_over_the_allowed() -> None:
    app, engine = app_with(CALL)
    async with openai_client(app) as client:
        response = await client.responses.create(
            model="gclm-fake",
            input="Time?",
            tools=RESPONSES_TOOLS,
            tool_choice=responses_choice("required", "get_time", "search"),
        )
    [item] = response.output
    assert item.type == "function_call" and item.name == "get_time"
    assert accepts(engine, call("search")) and not accepts(engine, call("get_weather"))
    assert not accepts(engine, "text")
    echoed = response.tool_choice
    assert echoed.type == "allowed_tools" and echoed.mode == "required"  # type: ignore[union-attr]


async def test_responses_auto_over_the_allowed() -> None:
    app, engine = app_with(("Noon.",))
    async with openai_client(app) as client:
        response = await client.responses.create(
            model="gclm-fake",
            input="Time?",
            tools=RESPONSES_TOOLS,
            tool_choice=responses_choice("auto", "get_time"),
        )
    assert response.output_text == "Noon."
    assert accepts(engine, "Noon.") and accepts(engine, call("get_time"))
    assert not accepts(engine, call("search"))


@pytest.mark.parametrize(
    ("choice", "param"),
    [
        (chat_choice("required", "nope"), "tool_choice.allowed_tools.tools[0]"),
        (chat_choice("auto", "get_time", "nope"), "tool_choice.allowed_tools.tools[1]"),
        (
            {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [{"x": 1}]}},
            "tool_choice.allowed_tools.tools[0]",
        ),
        (chat_choice("sometimes", "get_time"), "tool_choice"),
        ({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}, "tool_choice"),
    ],
)
async def test_chat_refusals_name_the_tool(choice: Any, param: str) -> None:
    app, engine = app_with(CALL)
    async with openai_client(app) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model="gclm-fake",
                messages=[{"role": "user", "content": "Time?"}],
                tools=CHAT_TOOLS,
                tool_choice=choice,
            )
    assert caught.value.param == param
    assert engine.submits == []


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        (RESPONSES_TOOLS, responses_choice("required", "nope"), "tool_choice.tools[0]"),
        (None, responses_choice("auto", "get_time"), "tool_choice"),
    ],
)
async def test_responses_refusals(tools: Any, choice: Any, param: str) -> None:
    app, engine = app_with(CALL)
    async with openai_client(app) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(
                model="gclm-fake", input="Time?", tools=tools or openai.omit, tool_choice=choice
            )
    assert caught.value.param == param
    assert engine.submits == []
