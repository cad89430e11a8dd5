"""Function tools on POST /v1/responses over the fake engine, through the openai SDK: the
function_call items, their stream events, the next turn's function_call_output, and the 400s."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from fake_engine import FakeEngine
from harness import http_client, openai_client

from gclm.server.app import create_app
from gclm.server.openai.tools.prompt import OPENER
from gclm.server.settings import ServerSettings

pytestmark = pytest.mark.anyio

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": True},
    {"type": "function", "name": "now", "description": "The time."},
]
CALL_SCRIPT = (OPENER, '[{"name": "get_weather", ', '"arguments": {"city": "Pa', 'ris"}}]')
TEXT_SCRIPT = ("<b>", "Sunny", " today.")


def app_with(script: tuple[str, ...]) -> tuple[Any, FakeEngine]:
    engine = FakeEngine(lambda request: script)
    return create_app(engine, ServerSettings()), engine


async def test_create_returns_function_call_items() -> None:
    app, engine = app_with(CALL_SCRIPT)
    async with openai_client(app) as client:
        response = await client.responses.create(
            model="gclm-fake", input="Weather in Paris?", tools=TOOLS, tool_choice="required"
        )
    assert response.status == "completed"
    [item] = response.output
    assert item.type == "function_call" and item.status == "completed"
    assert item.name == "get_weather" and json.loads(item.arguments) == {"city": "Paris"}
    assert item.call_id.startswith("call_") and item.id.startswith("fc_")
    assert response.output_text == ""
    assert response.tool_choice == "required" and response.parallel_tool_calls is True
    assert [t.name for t in response.tools] == ["get_weather", "now"]
    # The same constraint as chat: gclm's call format over these functions, in the prompt too.
    [submitted] = engine.submits
    assert submitted.constraint is not None
    prompt = bytes(submitted.prompt_ids).decode()
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt


async def test_stream_announces_only_the_calls() -> None:
    app, _ = app_with(CALL_SCRIPT)
    async with http_client(app) as http:
        body = {"input": "Weather?", "tools": TOOLS, "stream": True}
        async with http.stream("POST", "/v1/responses", json=body) as response:
            lines = [line async for line in response.aiter_lines() if line]
    data = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data:")]
    kinds = [d["type"] for d in data]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * (len(kinds) - 6),
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert len(kinds) > 7  # the arguments come in fragments
    added, done, completed = data[2]["item"], data[-2]["item"], data[-1]["response"]
    assert (added["type"], added["status"], added["arguments"]) == (
        "function_call",
        "in_progress",
        "",
    )
    deltas = "".join(d["delta"] for d in data if d["type"].endswith("arguments.delta"))
    assert json.loads(deltas) == {"city": "Paris"} == json.loads(data[-3]["arguments"])
    assert all(d["item_id"] == added["id"] for d in data if "item_id" in d)
    assert done == {**added, "status": "completed", "arguments": deltas}
    assert completed["output"] == [done] and completed["status"] == "completed"


async def test_sdk_stream_helper_with_a_tool() -> None:
    app, _ = app_with(CALL_SCRIPT)
    async with openai_client(app) as client:
        async with client.responses.stream(
            model="gclm-fake", input="Weather?", tools=TOOLS, tool_choice="auto"
        ) as stream:
            kinds = [event.type async for event in stream]
            final = await stream.get_final_response()
    assert "response.output_text.delta" not in kinds
    assert kinds.count("response.function_call_arguments.delta") > 1
    [call] = final.output
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris"}


async def test_auto_text_answer_is_a_message_announced_with_its_text() -> None:
    app, engine = app_with(TEXT_SCRIPT)
    async with openai_client(app) as client:
        stream = await client.responses.create(
            model="gclm-fake", input="Hi", tools=TOOLS, stream=True
        )
        events = [event async for event in stream]
        response = await client.responses.create(model="gclm-fake", input="Hi", tools=TOOLS)
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "".join(
        TEXT_SCRIPT
    )
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == response.output_text == "".join(TEXT_SCRIPT)
    assert response.output[0].type == "message"


async def test_two_turns_with_function_call_output() -> None:
    app, engine = app_with(CALL_SCRIPT)
    async with openai_client(app) as client:
        first = await client.responses.create(
            model="gclm-fake", input="Weather in Paris?", tools=TOOLS
        )
        [call] = first.output
        engine.script = lambda request: TEXT_SCRIPT
        history: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
        history += [item.model_dump(exclude_none=True) for item in first.output]
        history.append(
            {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "clear"}'}
        )
        second = await client.responses.create(model="gclm-fake", input=history, tools=TOOLS)
    assert second.output_text == "".join(TEXT_SCRIPT)
    prompt = bytes(engine.submits[1].prompt_ids).decode()
    assert (
        '<|assistant|><tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]\n'
        in prompt
    )
    assert '<|user|><tool_response>\n{"sky": "clear"}\n</tool_response>\n' in prompt


async def test_tool_choice_none_and_named() -> None:
    app, engine = app_with(TEXT_SCRIPT)
    async with openai_client(app) as client:
        plain = await client.responses.create(
            model="gclm-fake", input="Hi", tools=TOOLS, tool_choice="none"
        )
        engine.script = lambda request: (OPENER, '[{"name": "now", "arguments": {}}]')
        named = await client.responses.create(
            model="gclm-fake",
            input="Hi",
            tools=TOOLS,
            tool_choice={"type": "function", "name": "now"},
        )
    assert plain.output_text == "".join(TEXT_SCRIPT) and engine.submits[0].constraint is None
    assert "Do not call a function now" in bytes(engine.submits[0].prompt_ids).decode()
    [call] = named.output
    assert call.name == "now" and named.tool_choice.name == "now"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [TOOLS[1], TOOLS[1]]}, "tools[1].name"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "name": "f",
                        "parameters": {"properties": {"a": {"pattern": "(?=x)"}}},
                    }
                ]
            },
            "tools[0].parameters",
        ),
    ],
)
async def test_refusals_name_the_parameter(body: dict[str, Any], param: str) -> None:
    app, engine = app_with(TEXT_SCRIPT)
    async with openai_client(app) as client:
        with pytest.raises(openai.BadRequestError) as e:
            await client.responses.create(model="gclm-fake", **{"input": "Hi", **body})
    assert e.value.param is not None and e.value.param.startswith(param)
    assert not engine.submits


@pytest.mark.parametrize("choice", ["auto", "none", None])
async def test_text_cut_by_the_budget_is_incomplete(choice: str | None) -> None:
    engine = FakeEngine(lambda request: TEXT_SCRIPT, min_tokens=1)
    app = create_app(engine, ServerSettings())
    kwargs: dict[str, Any] = {"tools": TOOLS, "tool_choice": choice} if choice else {}
    async with openai_client(app) as client:
        cut = await client.responses.create(
            model="gclm-fake", input="Hi", max_output_tokens=2, **kwargs
        )
        stream = await client.responses.create(
            model="gclm-fake", input="Hi", max_output_tokens=2, stream=True, **kwargs
        )
        events = [event async for event in stream]
        whole = await client.responses.create(
            model="gclm-fake", input="Hi", max_output_tokens=3, **kwargs
        )
    assert (engine.submits[0].constraint is not None) is (choice == "auto")
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.output_text == "<b>Sunny"
    assert events[-1].type == "response.incomplete"
    assert whole.status == "completed"


async def test_max_tool_calls_bounds_the_calls_in_the_constraint() -> None:
    app, engine = app_with(CALL_SCRIPT)
    async with openai_client(app) as client:
        for limit in (None, 1, 2):
            await client.responses.create(
                model="gclm-fake", input="Hi", tools=TOOLS, max_tool_calls=limit
            )
        with pytest.raises(openai.BadRequestError) as e:
            await client.responses.create(
                model="gclm-fake", input="Hi", tools=TOOLS, max_tool_calls=0
            )
    assert e.value.param == "max_tool_calls"
    unbounded, one, two = (c.spec for c in engine.compiles)
    more = "(?:, (?:"  # the group of further calls
    assert more not in one
    assert more in two and two.endswith("){0,1}\\]")
    assert unbounded.endswith(")*\\]")
