"""End to end: a server whose chat template renders tools (`--chat-template`
tests/server/templates/tools.jinja on the embedded model), through the openai SDK: a
two-turn tool loop on each API, whose second prompt is the template's own rendering of the
tools, the call and the result (its token count is the one rendered here), and whose output
is still gclm's constrained call.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from bench._server import GclmServer
from gclm.server.engine.chat_template import encode_chat
from gclm.server.openai.tools.prompt import ToolDef, prompt_messages, template_tools, tool_plan

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"
TEMPLATE = Path(__file__).parent / "templates" / "tools.jinja"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
}
CHAT_TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
]


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    with GclmServer(max_batch=4, extra_args=("--chat-template", str(TEMPLATE))) as server:
        with openai.OpenAI(
            base_url=f"{server.url}/v1", api_key="x", timeout=300.0, max_retries=0
        ) as sdk:
            yield sdk
        log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log, f"the server logged an exception:\n{log[-4000:]}"


@pytest.fixture(scope="module")
def tool_tokenizer(embedded_tokenizer) -> Any:
    tokenizer = copy.copy(embedded_tokenizer)
    tokenizer.chat_template = TEMPLATE.read_text()
    return tokenizer


def template_prompt_tokens(tokenizer: Any, messages: list[dict[str, Any]], choice: str) -> int:
    """How many tokens the template's rendering of `messages` (chat dumps) takes."""
    tools = [ToolDef.model_validate(t) for t in CHAT_TOOLS]
    native = prompt_messages(messages, tools, tool_plan(tools, choice, None), native=True)
    return len(encode_chat(tokenizer, native, **template_tools(tools, True)))


def test_chat_tool_loop(client: openai.OpenAI, tool_tokenizer: Any) -> None:
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(
        model=MODEL, messages=messages, tools=CHAT_TOOLS, tool_choice="required", max_tokens=40
    )
    [call] = first.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"]
    assert first.usage is not None
    assert first.usage.prompt_tokens == template_prompt_tokens(tool_tokenizer, messages, "required")
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C."},
    ]
    second = client.chat.completions.create(
        model=MODEL, messages=messages, tools=CHAT_TOOLS, tool_choice="none", max_tokens=20
    )
    assert second.choices[0].message.content
    assert second.usage is not None
    history = [
        messages[0],
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        messages[2],
    ]
    assert second.usage.prompt_tokens == template_prompt_tokens(tool_tokenizer, history, "none")


def test_responses_tool_loop(client: openai.OpenAI, tool_tokenizer: Any) -> None:
    tools: Any = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
    history: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.responses.create(
        model=MODEL, input=history, tools=tools, tool_choice="required", max_output_tokens=40
    )
    [call] = first.output
    assert call.type == "function_call" and json.loads(call.arguments)["city"]
    history += [
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C."},
    ]
    second = client.responses.create(
        model=MODEL, input=history, tools=tools, tool_choice="none", max_output_tokens=20
    )
    assert second.output_text
    assert second.usage is not None
    chat_history = [
        history[0],
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 21 C."},
    ]
    assert second.usage.input_tokens == template_prompt_tokens(tool_tokenizer, chat_history, "none")
