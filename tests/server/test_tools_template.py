"""Tools through a chat template that renders them (tests/server/templates/tools.jinja, a
Hermes-layout ChatML on the embedded tokenizer): which templates count, what they are given,
and the prompt they write; the fallback (gclm's format in the messages) is in test_tools.py."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import openai
import pytest
from fake_engine import FakeEngine
from harness import openai_client

from gclm.server.app import create_app
from gclm.server.engine.chat_template import render_chat, renders_tools
from gclm.server.engine.shared import TokenizerPrompts
from gclm.server.openai.tools.prompt import (
    OPENER,
    ToolDef,
    prompt_messages,
    template_tools,
    tool_plan,
)
from gclm.server.settings import ServerSettings

pytestmark = pytest.mark.anyio

TEMPLATES = Path(__file__).parent / "templates"
TOOLS_TEMPLATE = (TEMPLATES / "tools.jinja").read_text()
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
]
TOOLS = [ToolDef.model_validate(t) for t in CHAT_TOOLS]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "content": "Sunny", "tool_call_id": "call_1"},
]


class Tokenizer:
    def __init__(self, template: Any) -> None:
        self.chat_template = template


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (TOOLS_TEMPLATE, True),
        ((TEMPLATES / "think.jinja").read_text(), False),
        (None, False),
        ("{# tools go here one day #}{% if m.role == 'tool' %}{% endif %}", False),
        ("{% if tools %}{{ tools | tojson }}{% endif %}{{ messages }}", False),  # no results
        ({"default": "{{ messages }}", "tool_use": TOOLS_TEMPLATE}, True),
    ],
)
def test_which_templates_render_tools(template: Any, expected: bool) -> None:
    assert renders_tools(Tokenizer(template)) is expected


def test_the_embedded_model_falls_back(embedded_tokenizer) -> None:
    prompts = TokenizerPrompts(embedded_tokenizer, None, lambda: 2048)  # type: ignore[arg-type]
    assert prompts.renders_tools is False  # SmolLM2's ChatML template knows no tools


def test_a_tool_template_writes_tools_calls_and_results(embedded_tokenizer) -> None:
    tokenizer = copy.copy(embedded_tokenizer)
    tokenizer.chat_template = TOOLS_TEMPLATE
    plan = tool_plan(TOOLS, "auto", None)
    messages = prompt_messages(HISTORY, TOOLS, plan, native=True)
    text = render_chat(tokenizer, messages, **template_tools(TOOLS, True))
    # The template's own layout: its tools section, the call, the result in a tool turn.
    assert "# Tools\nYou may call one or more functions." in text
    assert json.dumps(CHAT_TOOLS[0]) in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n' in text
    assert "<|im_start|>tool\nSunny<|im_end|>" in text
    assert "<tool_response>" not in text
    # gclm's block states the format the constraint enforces, not the tools a second time.
    assert f"answer with {OPENER} followed by a JSON list" in text
    assert text.count('"name": "get_weather"') == 2  # the signature and the earlier call

    fallback = prompt_messages(HISTORY, TOOLS, plan)
    assert [m["role"] for m in fallback] == ["system", "user", "assistant", "user"]
    assert "<tool_response>" in render_chat(tokenizer, fallback, **template_tools(TOOLS, False))


async def test_chat_and_responses_give_the_template_its_tools(tmp_path) -> None:
    engine = FakeEngine(lambda request: ("Sunny.",))
    engine.renders_tools = True
    app = create_app(engine, ServerSettings(cache_dir=tmp_path))
    async with openai_client(app) as client:
        await client.chat.completions.create(
            model="gclm-fake", messages=HISTORY, tools=CHAT_TOOLS, tool_choice="none"
        )
        await client.responses.create(
            model="gclm-fake",
            input=[
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "get_weather",
                    "arguments": '{"city": "Paris"}',
                },
                {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
            ],
            tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER}],
            tool_choice="none",
        )
    for kwargs, messages in zip(engine.template_kwargs, engine.chats, strict=True):
        assert kwargs["tools"] == CHAT_TOOLS
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
        assert "Do not call a function now" in messages[0]["content"]
        assert "<tools>" not in messages[0]["content"]  # the template lists them
        [call] = messages[2]["tool_calls"]
        assert call["id"] == "call_1"
        assert call["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
        assert messages[3] == {"role": "tool", "content": "Sunny", "tool_call_id": "call_1"}


async def test_tools_twice_for_the_template_is_a_400(tmp_path) -> None:
    engine = FakeEngine()
    engine.renders_tools = True
    app = create_app(engine, ServerSettings(cache_dir=tmp_path))
    async with openai_client(app) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model="gclm-fake",
                messages=HISTORY,
                tools=CHAT_TOOLS,
                extra_body={"chat_template_kwargs": {"tools": CHAT_TOOLS}},
            )
    assert caught.value.param == "chat_template_kwargs.tools"
    assert engine.submits == []
