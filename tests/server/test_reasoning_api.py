"""The reasoning controls and shapes on the HTTP layer (server/openai/reasoning.py), over the
scripted fake engine: which requests think, with which cap, the 400, and what comes back."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fake_engine import FakeEngine, Thought
from harness import http_client, sse_events

from gclm.masking.reasoning import ThinkingSpec
from gclm.server.app import create_app
from gclm.server.openai.reasoning import ReasoningParser
from gclm.server.settings import ServerSettings

pytestmark = pytest.mark.anyio

END_IDS = (7, 8, 9)  # a 3-token end marker
PARSER = ReasoningParser("deepseek_r1", "<think>", "</think>", END_IDS)
MESSAGES = [{"role": "user", "content": "Hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
FORMAT = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
MIN_TOKENS = 3  # the fake engine's tables'


def thinking_script(request: Any) -> list[Any]:
    return [Thought("<think>hm"), Thought(", yes"), '{"a": ', "1}"]


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(thinking_script, min_tokens=MIN_TOKENS)


def app_for(engine: FakeEngine, tmp_path, parser: ReasoningParser | None = PARSER) -> Any:
    return create_app(engine, ServerSettings(cache_dir=tmp_path), reasoning=parser)


async def post(app: Any, **body: Any) -> Any:
    async with http_client(app) as http:
        return await http.post("/v1/chat/completions", json={"messages": MESSAGES, **body})


async def test_thinking_request_shapes(engine: FakeEngine, tmp_path) -> None:
    app = app_for(engine, tmp_path)
    response = await post(app, response_format=FORMAT, max_tokens=20)
    assert response.status_code == 200, response.text
    body = response.json()
    message = body["choices"][0]["message"]
    assert message["content"] == '{"a": 1}'
    assert message["reasoning"] == message["reasoning_content"] == "hm, yes"
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 2}
    [request] = engine.submits
    assert request.thinking == ThinkingSpec(END_IDS)  # high effort: no cap of its own


async def test_stream_deltas(engine: FakeEngine, tmp_path) -> None:
    app = app_for(engine, tmp_path)
    async with http_client(app) as http:
        body = {"messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}}
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            events = await sse_events(response)
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    thoughts = [d["reasoning"] for d in deltas if "reasoning" in d]
    assert thoughts == ["hm", ", yes"]
    assert all(d["reasoning_content"] == d["reasoning"] for d in deltas if "reasoning" in d)
    assert "".join(d.get("content", "") for d in deltas) == '{"a": 1}'
    assert chunks[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 2}


async def test_budget_below_marker_plus_answer_is_refused(engine: FakeEngine, tmp_path) -> None:
    app = app_for(engine, tmp_path)
    need = len(END_IDS) + MIN_TOKENS
    response = await post(app, response_format=FORMAT, max_tokens=need - 1)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "budget_too_small" and f"at least {need}" in error["message"]
    assert (await post(app, response_format=FORMAT, max_tokens=need)).status_code == 200
    # Without thinking, the answer's minimum is enough.
    ok = await post(app, response_format=FORMAT, max_tokens=MIN_TOKENS, reasoning_effort="none")
    assert ok.status_code == 200


@pytest.mark.parametrize(
    ("extra", "cap"),
    [
        ({"reasoning_effort": "low"}, (100 - 6) // 4),
        ({"reasoning_effort": "medium"}, (100 - 6) // 2),
        ({"reasoning_effort": "high"}, 100 - 6),
        ({"thinking_token_budget": 10}, 10),
        ({"thinking_token_budget": 40, "reasoning_effort": "low"}, 23),
    ],
)
async def test_caps(engine: FakeEngine, tmp_path, extra: dict[str, Any], cap: int) -> None:
    app = app_for(engine, tmp_path)
    response = await post(app, response_format=FORMAT, max_tokens=100, **extra)
    assert response.status_code == 200, response.text
    assert engine.submits[-1].thinking == ThinkingSpec(END_IDS, cap=cap)


@pytest.mark.parametrize(
    "extra",
    [{"reasoning_effort": "none"}, {"chat_template_kwargs": {"enable_thinking": False}}],
)
async def test_thinking_off(engine: FakeEngine, tmp_path, extra: dict[str, Any]) -> None:
    engine.script = lambda request: ['{"a": 1}']
    app = app_for(engine, tmp_path)
    response = await post(app, max_tokens=20, **extra)
    message = response.json()["choices"][0]["message"]
    assert "reasoning" not in message
    assert response.json()["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}
    assert engine.submits[-1].thinking is None
    assert engine.template_kwargs[-1] == {"enable_thinking": False}


RESPONSES_FORMAT = {"format": {"type": "json_schema", "name": "a", "schema": SCHEMA}}


async def test_responses_think_first(engine: FakeEngine, tmp_path) -> None:
    """A reasoning item (the thinking, start marker stripped) before the message; the
    budget covers both; usage counts the thinking."""
    async with http_client(app_for(engine, tmp_path)) as http:
        body = {"input": "Hi", "text": RESPONSES_FORMAT, "max_output_tokens": 20}
        response = await http.post("/v1/responses", json=body)
    assert response.status_code == 200, response.text
    out = response.json()
    reasoning, message = out["output"]
    assert reasoning["type"] == "reasoning" and reasoning["id"].startswith("rs_")
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "hm, yes"}]
    assert message["type"] == "message" and message["content"][0]["text"] == '{"a": 1}'
    assert out["usage"]["output_tokens_details"] == {"reasoning_tokens": 2}
    assert engine.template_kwargs[-1] == {}  # the template opens the thinking
    assert engine.submits[-1].thinking == ThinkingSpec(END_IDS)
    assert engine.submits[-1].params.max_tokens == 20


async def test_responses_effort_caps_or_turns_thinking_off(engine: FakeEngine, tmp_path) -> None:
    async with http_client(app_for(engine, tmp_path)) as http:
        body = {"input": "Hi", "text": RESPONSES_FORMAT, "max_output_tokens": 100}
        low = await http.post("/v1/responses", json={**body, "reasoning": {"effort": "low"}})
        assert low.status_code == 200 and low.json()["reasoning"] == {"effort": "low"}
        assert engine.submits[-1].thinking == ThinkingSpec(END_IDS, cap=(100 - 6) // 4)
        engine.script = lambda request: ['{"a": 1}']
        off = await http.post("/v1/responses", json={**body, "reasoning": {"effort": "none"}})
    assert [item["type"] for item in off.json()["output"]] == ["message"]
    assert engine.template_kwargs[-1] == {"enable_thinking": False}
    assert engine.submits[-1].thinking is None


async def test_responses_stream_the_reasoning_item_first(engine: FakeEngine, tmp_path) -> None:
    async with http_client(app_for(engine, tmp_path)) as http:
        body = {"input": "Hi", "text": RESPONSES_FORMAT, "max_output_tokens": 20, "stream": True}
        async with http.stream("POST", "/v1/responses", json=body) as response:
            events = [json.loads(e) for e in await sse_events(response)]
    kinds = [(e["type"], e.get("output_index")) for e in events]
    assert kinds == [
        ("response.created", None),
        ("response.in_progress", None),
        ("response.output_item.added", 0),
        ("response.reasoning_text.delta", 0),
        ("response.reasoning_text.delta", 0),
        ("response.reasoning_text.done", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1),
        ("response.content_part.added", 1),
        ("response.output_text.delta", 1),
        ("response.output_text.delta", 1),
        ("response.output_text.done", 1),
        ("response.content_part.done", 1),
        ("response.output_item.done", 1),
        ("response.completed", None),
    ]
    assert [e["delta"] for e in events if e["type"] == "response.reasoning_text.delta"] == [
        "hm",
        ", yes",
    ]
    final = events[-1]["response"]
    assert final["output"][0]["content"][0]["text"] == "hm, yes"
    assert final["usage"]["output_tokens_details"] == {"reasoning_tokens": 2}


async def test_responses_reasoning_needs_a_reasoning_model(engine: FakeEngine, tmp_path) -> None:
    async with http_client(app_for(engine, tmp_path, parser=None)) as http:
        high = {"input": "Hi", "reasoning": {"effort": "high"}}
        refused = await http.post("/v1/responses", json=high)
        bad = {"input": "Hi", "reasoning": {"effort": "extreme"}}
        invalid = await http.post("/v1/responses", json=bad)
        off = await http.post(
            "/v1/responses", json={"input": "Hi", "reasoning": {"effort": "none"}}
        )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "reasoning"
    assert "--reasoning-parser" in refused.json()["error"]["message"]
    assert invalid.status_code == 400 and invalid.json()["error"]["param"] == "reasoning"
    assert off.status_code == 200, off.text
    async with http_client(app_for(engine, tmp_path, parser=None)) as http:
        unknown = await http.post("/v1/responses", json={"input": "Hi", "reasoning": {"x": 1}})
        summary = {"input": "Hi", "reasoning": {"summary": "auto", "x": None}}
        unset = await http.post("/v1/responses", json=summary)  # an empty value is unset
    assert unknown.status_code == 400 and "'x'" in unknown.json()["error"]["message"]
    assert unset.status_code == 200 and unset.json()["reasoning"] == {"summary": "auto"}


async def test_include_reasoning_false(engine: FakeEngine, tmp_path) -> None:
    app = app_for(engine, tmp_path)
    response = await post(app, max_tokens=20, include_reasoning=False)
    body = response.json()
    assert body["choices"][0]["message"]["reasoning"] is None
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 2}


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"reasoning_effort": "low"}, "reasoning_effort"), ({"thinking_token_budget": 5}, None)],
)
async def test_controls_need_a_reasoning_model(
    engine: FakeEngine, tmp_path, extra: dict[str, Any], param: str | None
) -> None:
    app = app_for(engine, tmp_path, parser=None)
    response = await post(app, **extra)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == (param or "thinking_token_budget")
    assert "--reasoning-parser" in error["message"]
    assert (await post(app, reasoning_effort="none")).status_code == 200


async def test_unknown_effort_is_refused(engine: FakeEngine, tmp_path) -> None:
    response = await post(app_for(engine, tmp_path), reasoning_effort="max")
    assert response.status_code == 400


class _Tokenizer:
    """Spells "</think>" as three tokens."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return {"</think>": [7, 8, 9]}[text]

    def decode(self, ids: list[int]) -> str:
        return "".join({7: "</", 8: "think", 9: ">"}[i] for i in ids)


def test_parser_named() -> None:
    parser = ReasoningParser.named("qwen3", _Tokenizer())
    assert parser.end_ids == END_IDS and parser.end == "</think>"
    assert parser.strip_start("\n<think>\nhm") == "\nhm"
    assert parser.strip_start("hm") == "hm"
    with pytest.raises(ValueError, match="Unknown reasoning parser"):
        ReasoningParser.named("nope", _Tokenizer())


def test_settings_validate_the_parser(tmp_path) -> None:
    with pytest.raises(ValueError, match="reasoning_parser must be deepseek_r1 or qwen3"):
        ServerSettings(cache_dir=tmp_path, reasoning_parser="nope")
    assert ServerSettings(cache_dir=tmp_path, reasoning_parser="qwen3").reasoning_parser == "qwen3"
    on_vllm = ServerSettings(cache_dir=tmp_path, reasoning_parser="qwen3", engine="vllm")
    assert on_vllm.reasoning_parser == "qwen3"  # --engine vllm thinks too


async def test_responses_calls_after_thinking_through_the_sdk(tmp_path) -> None:
    """The openai SDK reads the reasoning item, then the function_call item (streamed, its
    output_index after the reasoning's), and the final response holds both in order."""
    from harness import openai_client

    from gclm.server.openai.tools.prompt import OPENER

    call = (OPENER, '[{"name": "get_weather", ', '"arguments": {"city": "Pa', 'ris"}}]')
    engine = FakeEngine(lambda request: [Thought("<think>rain?"), *call], min_tokens=MIN_TOKENS)
    weather = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tools: list[Any] = [{"type": "function", "name": "get_weather", "parameters": weather}]
    async with openai_client(app_for(engine, tmp_path)) as client:
        plain = await client.responses.create(
            model="gclm-fake", input="Weather?", tools=tools, tool_choice="required"
        )
        stream = await client.responses.create(
            model="gclm-fake", input="Weather?", tools=tools, tool_choice="required", stream=True
        )
        events = [event async for event in stream]
    for response in (plain, events[-1].response):
        reasoning, item = response.output
        assert reasoning.type == "reasoning" and reasoning.content[0].text == "rain?"
        assert item.type == "function_call" and json.loads(item.arguments) == {"city": "Paris"}
        assert response.usage.output_tokens_details.reasoning_tokens == 1
    added = [
        (e.output_index, e.item.type) for e in events if e.type == "response.output_item.added"
    ]
    assert added == [(0, "reasoning"), (1, "function_call")]


async def test_chat_calls_after_thinking_through_the_sdk(tmp_path) -> None:
    """Chat with tools: the thinking comes back beside the calls (message and stream),
    finish_reason "tool_calls"; `include_reasoning: false` leaves it out."""
    from harness import openai_client

    from gclm.server.openai.tools.prompt import OPENER

    call = (OPENER, '[{"name": "get_weather", ', '"arguments": {"city": "Pa', 'ris"}}]')
    engine = FakeEngine(lambda request: [Thought("<think>rain?"), *call], min_tokens=MIN_TOKENS)
    weather = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tools: list[Any] = [
        {"type": "function", "function": {"name": "get_weather", "parameters": weather}}
    ]
    ask = {"model": "gclm-fake", "messages": MESSAGES, "tools": tools, "tool_choice": "required"}
    async with openai_client(app_for(engine, tmp_path)) as client:
        plain = await client.chat.completions.create(**ask)
        hidden = await client.chat.completions.create(
            **ask, extra_body={"include_reasoning": False}
        )
        stream = await client.chat.completions.create(**ask, stream=True)
        chunks = [chunk async for chunk in stream]
    choice = plain.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [made] = choice.message.tool_calls
    assert made.function.name == "get_weather"
    assert json.loads(made.function.arguments) == {"city": "Paris"}
    assert choice.message.model_extra["reasoning"] == "rain?"
    assert choice.message.model_extra["reasoning_content"] == "rain?"
    assert plain.usage.completion_tokens_details.reasoning_tokens == 1
    assert hidden.choices[0].message.model_extra["reasoning"] is None
    assert hidden.choices[0].message.tool_calls[0].function.name == "get_weather"
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    order = [
        "r" if (d.model_extra or {}).get("reasoning") else "t"
        for d in deltas
        if d.tool_calls or (d.model_extra or {}).get("reasoning")
    ]
    assert order == sorted(order) and order[0] == "r" and "t" in order  # thinking first
    assert "".join((d.model_extra or {}).get("reasoning") or "" for d in deltas) == "rain?"
    streamed = "".join(d.tool_calls[0].function.arguments or "" for d in deltas if d.tool_calls)
    assert json.loads(streamed) == {"city": "Paris"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
