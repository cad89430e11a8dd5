"""End to end: the embedded model made to think (a chat template that opens `<think>`, plain
text: `</think>` is 3 tokens), served with `--reasoning-parser deepseek_r1`, through the
official openai SDK: the forced close, the 400 naming the minimum, every budget from the
minimum up valid and complete, streaming, the controls, and `chat.completions.parse()`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from bench._server import GclmServer

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"
TEMPLATE = Path(__file__).parent / "templates" / "think.jinja"
MARKER_TOKENS = 3  # "</think>": "</", "think", ">"
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
MESSAGES = [{"role": "user", "content": "Invent a person. Think first, then answer in JSON."}]


@pytest.fixture(scope="module")
def client(thinking_server: GclmServer) -> Iterator[openai.OpenAI]:
    """The SDK on the session's thinking server (tests/server/e2e_thinking_server.py)."""
    with openai.OpenAI(
        base_url=f"{thinking_server.url}/v1", api_key="x", timeout=300.0, max_retries=0
    ) as sdk:
        yield sdk


def refused_minimum(client: openai.OpenAI, **extra: Any) -> int:
    """The minimum budget the 400 for max_tokens=1 names."""
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, response_format=FORMAT, max_tokens=1, **extra
        )
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "budget_too_small"
    return int(body["message"].split("needs ")[1].split(" tokens")[0])


@pytest.fixture(scope="module")
def minimum(client: openai.OpenAI) -> int:
    return refused_minimum(client)


def test_minimum_counts_the_end_marker(client: openai.OpenAI, minimum: int) -> None:
    answer_only = refused_minimum(client, reasoning_effort="none")
    assert minimum == answer_only + MARKER_TOKENS
    with pytest.raises(openai.BadRequestError, match=f"at least {minimum}"):
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, response_format=FORMAT, max_tokens=minimum - 1
        )


def check(completion: Any, budget: int) -> tuple[str, int]:
    """A complete, valid answer within the budget; returns (reasoning, reasoning tokens)."""
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    usage = completion.usage
    assert usage.completion_tokens <= budget
    thought = usage.completion_tokens_details.reasoning_tokens
    assert MARKER_TOKENS <= thought < usage.completion_tokens
    reasoning = choice.message.model_extra["reasoning"]
    assert reasoning == choice.message.model_extra["reasoning_content"]
    assert "</think>" not in reasoning and "</think>" not in choice.message.content
    return reasoning, thought


def test_forced_close_at_the_minimum(client: openai.OpenAI, minimum: int) -> None:
    """At the minimum, thinking has no room: the marker is forced at once and the answer gets
    exactly its minimum."""
    completion = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, response_format=FORMAT, max_tokens=minimum, seed=3
    )
    reasoning, thought = check(completion, minimum)
    assert reasoning == "" and thought == MARKER_TOKENS
    assert completion.usage.completion_tokens == minimum


def test_every_budget_from_the_minimum(client: openai.OpenAI, minimum: int) -> None:
    """Valid, complete, finish_reason "stop", within budget, at every budget from the
    minimum to minimum + 23; thinking takes what the answer does not need."""

    def ask(budget: int) -> tuple[int, Any]:
        return budget, client.chat.completions.create(
            model=MODEL, messages=MESSAGES, response_format=FORMAT, max_tokens=budget, seed=budget
        )

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(ask, range(minimum, minimum + 24)))
    for budget, completion in results:
        reasoning, thought = check(completion, budget)
        if budget > minimum:
            assert reasoning  # room to think: the model thought


def test_stream_sends_reasoning_then_content(client: openai.OpenAI, minimum: int) -> None:
    budget = minimum + 20
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        response_format=FORMAT,
        max_tokens=budget,
        stream=True,
        stream_options={"include_usage": True},
    )
    reasoning, content, order, usage, finish = [], [], [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            if "reasoning" in extra:
                assert extra["reasoning"] == extra["reasoning_content"]
                reasoning.append(extra["reasoning"])
                order.append("r")
            if choice.delta.content:
                content.append(choice.delta.content)
                order.append("c")
            finish = choice.finish_reason or finish
    assert finish == "stop" and reasoning and content
    assert order == sorted(order, reverse=True)  # every reasoning delta before any content
    jsonschema.validate(json.loads("".join(content)), SCHEMA)
    assert usage is not None and usage.completion_tokens <= budget
    assert usage.completion_tokens_details.reasoning_tokens >= MARKER_TOKENS


def test_effort_none_does_not_think(client: openai.OpenAI, minimum: int) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        response_format=FORMAT,
        max_tokens=minimum + 10,
        reasoning_effort="none",
    )
    message = completion.choices[0].message
    jsonschema.validate(json.loads(message.content), SCHEMA)
    assert "reasoning" not in (message.model_extra or {})
    assert completion.usage.completion_tokens_details.reasoning_tokens == 0


def test_thinking_caps(client: openai.OpenAI, minimum: int) -> None:
    """thinking_token_budget and reasoning_effort cap the thinking, never the answer."""
    budget = minimum + 40
    capped = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        response_format=FORMAT,
        max_tokens=budget,
        extra_body={"thinking_token_budget": 5},
    )
    assert check(capped, budget)[1] <= 5 + MARKER_TOKENS
    low = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        response_format=FORMAT,
        max_tokens=budget,
        reasoning_effort="low",
    )
    assert check(low, budget)[1] <= (budget - minimum) // 4 + MARKER_TOKENS


def test_include_reasoning_false(client: openai.OpenAI, minimum: int) -> None:
    completion = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        response_format=FORMAT,
        max_tokens=minimum + 10,
        extra_body={"include_reasoning": False},
    )
    message = completion.choices[0].message
    assert message.model_extra["reasoning"] is None
    jsonschema.validate(json.loads(message.content), SCHEMA)
    assert completion.usage.completion_tokens_details.reasoning_tokens >= MARKER_TOKENS


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int


def test_sdk_parse_gets_the_answer(client: openai.OpenAI) -> None:
    completion = client.chat.completions.parse(
        model=MODEL, messages=MESSAGES, response_format=Person, max_tokens=60
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Person)
    assert completion.usage.completion_tokens <= 60


def test_pydantic_ai_agent_thinks_then_gets_its_output(client: openai.OpenAI) -> None:
    """pydantic-ai's chat model with a native (response_format) output: the agent reads the
    thinking as a ThinkingPart and validates the answer as a Person."""
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.messages import ModelResponse, TextPart, ThinkingPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    budget = 80

    async def run() -> Any:
        async with openai.AsyncOpenAI(
            base_url=str(client.base_url), api_key="x", timeout=300.0, max_retries=0
        ) as sdk:
            model = OpenAIChatModel(MODEL, provider=OpenAIProvider(openai_client=sdk))
            agent = Agent(model, output_type=NativeOutput(Person))
            settings = {"max_tokens": budget, "temperature": 0}
            return await agent.run(MESSAGES[0]["content"], model_settings=settings)

    result = asyncio.run(run())
    assert isinstance(result.output, Person)
    [response] = [m for m in result.all_messages() if isinstance(m, ModelResponse)]
    kinds = [type(part) for part in response.parts]
    assert kinds == [ThinkingPart, TextPart], "the thinking, then the answer"
    thought = response.parts[0].content
    assert thought.strip() and "</think>" not in thought and "<think>" not in thought
    usage = result.usage
    assert 3 <= usage.details["reasoning_tokens"] < usage.output_tokens <= budget


def test_sdk_responses_parse_after_thinking(client: openai.OpenAI) -> None:
    """/v1/responses thinks too: a reasoning item, then the message the SDK parses; the
    budget (max_output_tokens) covers both; streamed, the same through the SDK's stream."""
    budget = 60
    # Greedy: sampled, the model may write "<think>" inside its own thinking.
    request = {
        "model": MODEL,
        "input": MESSAGES[0]["content"],
        "text_format": Person,
        "max_output_tokens": budget,
        "temperature": 0,
    }
    response = client.responses.parse(**request)
    with client.responses.stream(**request) as stream:
        deltas = [e.delta for e in stream if e.type == "response.reasoning_text.delta"]
        streamed = stream.get_final_response()
    assert deltas
    for got in (response, streamed):
        assert got.status == "completed"
        reasoning, message = got.output
        assert reasoning.type == "reasoning" and message.type == "message"
        thought = reasoning.content[0].text
        assert thought.strip() and "</think>" not in thought and "<think>" not in thought
        assert "</think>" not in message.content[0].text
        assert isinstance(got.output_parsed, Person)
        usage = got.usage
        assert MARKER_TOKENS <= usage.output_tokens_details.reasoning_tokens
        assert usage.output_tokens_details.reasoning_tokens < usage.output_tokens <= budget
    assert "".join(deltas) == streamed.output[0].content[0].text


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
]
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris? Think first."}]


def check_tool_calls(client: openai.OpenAI, budgets: range, stream_budget: int) -> None:
    """Tools after thinking: from the tool request's minimum up, the thinking, then valid
    calls with finish_reason "tool_calls", within max_tokens (and the same streamed)."""
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL, messages=ASK_WEATHER, tools=TOOLS, tool_choice="required", max_tokens=1
        )
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "budget_too_small"
    least = int(body["message"].split("needs ")[1].split(" tokens")[0])
    for budget in (least + b for b in budgets):
        completion = client.chat.completions.create(
            model=MODEL,
            messages=ASK_WEATHER,
            tools=TOOLS,
            tool_choice="required",
            max_tokens=budget,
            seed=budget,
        )
        choice = completion.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        for call in choice.message.tool_calls:
            assert call.function.name == "get_weather"
            jsonschema.validate(json.loads(call.function.arguments), WEATHER)
        reasoning = choice.message.model_extra["reasoning"]
        assert "</think>" not in reasoning and bool(reasoning) == (budget > least)
        thought = completion.usage.completion_tokens_details.reasoning_tokens
        assert MARKER_TOKENS <= thought < completion.usage.completion_tokens <= budget
    stream = client.chat.completions.create(
        model=MODEL,
        messages=ASK_WEATHER,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=least + stream_budget,
        stream=True,
    )
    order: list[str] = []
    thinking: list[str] = []
    arguments: dict[int, str] = {}  # per call index
    finish = None
    for chunk in stream:
        for c in chunk.choices:
            extra = c.delta.model_extra or {}
            if extra.get("reasoning"):
                thinking.append(extra["reasoning"])
                order.append("r")
            if c.delta.tool_calls:
                for t in c.delta.tool_calls:
                    arguments[t.index] = arguments.get(t.index, "") + (t.function.arguments or "")
                order.append("t")
            finish = c.finish_reason or finish
    assert finish == "tool_calls" and thinking and order == sorted(order)  # thinking first
    assert "</think>" not in "".join(thinking)
    assert arguments
    for text in arguments.values():
        jsonschema.validate(json.loads(text), WEATHER)


def test_tool_calls_after_thinking(client: openai.OpenAI) -> None:
    check_tool_calls(client, range(0, 6), stream_budget=20)
