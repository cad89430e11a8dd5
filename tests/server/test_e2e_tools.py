"""End to end: tool calling on a real `gclm serve` (embedded model) with the openai SDK,
pydantic-ai's default output mode (a `final_result` tool, tool_choice "required") and
LangChain's `with_structured_output(method="function_calling")`.

Every call's arguments are checked with jsonschema, whatever the model chose to write.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from e2e_server import GclmServer
from test_e2e_responses import Person

from gclm.server.engine.model_loader import load_tokenizer
from gclm.server.openai.tools.prompt import OPENER

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}}}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def assert_calls(choice: Any, names: set[str] | None = None) -> None:
    """finish_reason "tool_calls", content null, and every call's arguments valid."""
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.id.startswith("call_") and call.type == "function"
        assert call.function.name in (names or SCHEMAS)
        schema = SCHEMAS[call.function.name]
        jsonschema.Draft202012Validator(schema).validate(json.loads(call.function.arguments))


def minimum(client: openai.OpenAI, **request: Any) -> int:
    """The call's minimum budget, read from the 400 that max_tokens=1 earns."""
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1, **request)
    assert caught.value.param == "max_tokens"
    return int(caught.value.message.split("needs ")[1].split()[0])


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_time"}}],
)
def test_every_call_is_complete_from_the_minimum_budget_up(
    client: openai.OpenAI, tool_choice: Any
) -> None:
    names = None if tool_choice == "required" else {"get_time"}
    low = minimum(client, tools=TOOLS, tool_choice=tool_choice)
    for budget in range(low, low + 6):
        done = client.chat.completions.create(
            model=MODEL, messages=ASK, tools=TOOLS, tool_choice=tool_choice,
            max_tokens=budget, n=2, temperature=1.0, seed=budget,
        )  # fmt: skip
        assert len(done.choices) == 2
        for choice in done.choices:
            assert_calls(choice, names)
        assert done.usage.completion_tokens <= 2 * budget


def test_streamed_calls_match_openai_deltas(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=60,
        stream=True, n=2, stream_options={"include_usage": True},
    )  # fmt: skip
    args: dict[tuple[int, int], str] = {}
    names: dict[tuple[int, int], str] = {}
    finish: dict[int, str] = {}
    for chunk in stream:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                key = (choice.index, call.index)
                if call.id is not None:  # the first delta of a call: id and name
                    assert key not in names and call.function.name
                    names[key] = call.function.name
                assert key in names  # never arguments before the name
                args[key] = args.get(key, "") + (call.function.arguments or "")
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    assert finish == {0: "tool_calls", 1: "tool_calls"}
    assert {i for i, _ in names} == {0, 1}
    for key, name in names.items():
        jsonschema.validate(json.loads(args[key]), SCHEMAS[name])


def test_history_with_calls_and_results(client: openai.OpenAI) -> None:
    arguments = json.dumps({"city": "Paris", "unit": "c"})
    function = {"name": "get_weather", "arguments": arguments}
    call = {"id": "call_1", "type": "function", "function": function}
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees and sunny"},
    ]
    done = client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=12
    )
    assert done.choices[0].message.content
    assert done.choices[0].message.tool_calls is None


def opener_bias(strength: float) -> dict[str, float]:
    """Push the model towards writing the opener, to test what the budget lets it do."""
    return {str(t): strength for t in load_tokenizer().encode(OPENER)}


def test_auto_answers_in_text_when_no_call_fits(client: openai.OpenAI) -> None:
    low = minimum(client, tools=TOOLS, tool_choice="required")
    for budget in (1, 3, low - 1):
        done = client.chat.completions.create(
            model=MODEL, messages=ASK, tools=TOOLS, tool_choice="auto", max_tokens=budget,
            logit_bias=opener_bias(100), n=2,
        )  # fmt: skip
        for choice in done.choices:
            assert choice.message.tool_calls is None
            assert not choice.message.content.startswith(OPENER)
            assert choice.finish_reason == "length"  # pushed to the opener, it never ends


def test_auto_calls_when_the_call_fits(client: openai.OpenAI) -> None:
    low = minimum(client, tools=TOOLS, tool_choice="required")
    done = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="auto", max_tokens=low + 10,
        logit_bias=opener_bias(30), temperature=0,
    )  # fmt: skip
    # Greedy: sampled at T=1 the opener's later tokens could still lose, and then the answer
    # is text (correctly, but not what this test checks).
    assert_calls(done.choices[0])


def test_sdk_parse_with_pydantic_function_tool(client: openai.OpenAI) -> None:
    done = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a person."}],
        tools=[openai.pydantic_function_tool(Person)],
        tool_choice="required",
        max_tokens=40,
    )
    (call,) = done.choices[0].message.tool_calls[:1]
    assert isinstance(call.function.parsed_arguments, Person)


def test_pydantic_ai_default_output_mode(gclm_server: GclmServer) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    async def run() -> Any:
        url = f"{gclm_server.url}/v1"
        async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0) as client:
            model = OpenAIChatModel(MODEL, provider=OpenAIProvider(openai_client=client))
            agent = Agent(model, output_type=Person)  # the default: a final_result tool
            result = await agent.run(
                "Describe a person.", model_settings={"max_tokens": 60, "temperature": 0}
            )
            return result.output

    assert isinstance(asyncio.run(run()), Person)


def test_langchain_function_calling(gclm_server: GclmServer) -> None:
    from langchain_openai import ChatOpenAI

    with httpx.Client(timeout=300.0) as http:
        llm = ChatOpenAI(
            model=MODEL, base_url=f"{gclm_server.url}/v1", api_key="x", temperature=0,
            max_tokens=60, max_retries=0, http_client=http,
        )  # fmt: skip
        person = llm.with_structured_output(Person, method="function_calling").invoke(
            "Describe a person."
        )
        assert isinstance(person, Person)
        llm_tools = llm.bind_tools([Person], tool_choice="Person")
        message = llm_tools.invoke("Describe a person.")
        assert message.tool_calls and message.tool_calls[0]["name"] == "Person"
        Person.model_validate(message.tool_calls[0]["args"])
