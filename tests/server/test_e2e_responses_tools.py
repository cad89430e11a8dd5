"""End to end on the embedded model: function tools on the Responses API through the openai
SDK (create, the stream helper, a two-turn loop with function_call_output), finish_reason
"length" for free text cut under tool_choice "auto", and cached_tokens from the KV store.

Every call's arguments are checked with jsonschema, whatever the model chose to write.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": True},
]
ASK = "What is the weather in Paris?"


def assert_call(item: Any) -> None:
    assert item.type == "function_call" and item.status == "completed"
    assert item.name == "get_weather" and item.call_id.startswith("call_")
    jsonschema.Draft202012Validator(WEATHER).validate(json.loads(item.arguments))


def test_create_with_tools(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL, input=ASK, tools=TOOLS, tool_choice="required", max_output_tokens=40
    )
    assert response.status == "completed"
    assert response.output and all(item.type == "function_call" for item in response.output)
    for item in response.output:
        assert_call(item)


def test_stream_helper_with_a_tool(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model=MODEL,
        input=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=40,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[2] == "response.output_item.added" and events[2].item.type == "function_call"
    assert "response.output_text.delta" not in kinds
    [call] = final.output
    assert_call(call)
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert "".join(deltas) == call.arguments
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done.arguments == call.arguments


def test_two_turn_loop_with_function_call_output(client: openai.OpenAI) -> None:
    history: list[Any] = [{"role": "user", "content": ASK}]
    first = client.responses.create(
        model=MODEL, input=history, tools=TOOLS, tool_choice="required", max_output_tokens=40
    )
    [call] = first.output[:1]
    assert_call(call)
    history += [item.model_dump(exclude_none=True) for item in first.output]
    for item in first.output:
        result = {"city": json.loads(item.arguments)["city"], "sky": "sunny", "temp_c": 21}
        history.append(
            {"type": "function_call_output", "call_id": item.call_id, "output": json.dumps(result)}
        )
    second = client.responses.create(
        model=MODEL, input=history, tools=TOOLS, tool_choice="none", max_output_tokens=30
    )
    [message] = second.output
    assert message.type == "message" and second.output_text
    assert second.status in ("completed", "incomplete")


def test_free_text_cut_under_auto_is_length(client: openai.OpenAI) -> None:
    """A story in 4 tokens is cut, whatever tool_choice; "stop" only when the model ends."""
    story = [{"role": "user", "content": "Write a long story about a dragon."}]
    chat_tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
    cases: list[dict[str, Any]] = [
        {"tools": chat_tools, "tool_choice": "auto"},
        {"tools": chat_tools, "tool_choice": "none"},
        {},
    ]
    for kwargs in cases:
        done = client.chat.completions.create(
            model=MODEL, messages=story, max_tokens=4, temperature=0, **kwargs
        )
        assert done.choices[0].message.tool_calls is None
        assert done.choices[0].finish_reason == "length", kwargs
    response = client.responses.create(
        model=MODEL, input=story, tools=TOOLS, max_output_tokens=4, temperature=0
    )
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"


def test_cached_tokens_count_the_reused_prefix(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Name three colours of the rainbow, please."}]
    for _ in range(2):
        done = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=2, temperature=0
        )
    assert done.usage is not None
    details = done.usage.prompt_tokens_details
    # The second time the KV store holds the whole prompt but its last token.
    assert details is not None and details.cached_tokens == done.usage.prompt_tokens - 1
    assert done.usage.completion_tokens_details.reasoning_tokens == 0
    response = client.responses.create(
        model=MODEL, input=messages, max_output_tokens=2, temperature=0
    )
    assert response.usage is not None
    assert response.usage.input_tokens_details.cached_tokens == response.usage.input_tokens - 1
