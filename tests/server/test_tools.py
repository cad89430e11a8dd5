"""Tool calling without a model: the format's regex, the output reader, the budget rule of
"auto" on the embedded model's real vocabulary, and the HTTP shapes over the fake engine."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from typing import Any

import openai
import pytest
from fake_engine import FakeEngine
from harness import openai_client

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.compile import compile_constraint
from gclm.compiler.whole.tables import CompiledTable
from gclm.errors import QUOTE_LIMIT, InvalidRequestError
from gclm.masking import ConstraintState
from gclm.server.app import create_app
from gclm.server.engine.model_loader import load_tokenizer
from gclm.server.openai.tools.calls import CallReader
from gclm.server.openai.tools.prompt import (
    OPENER,
    NamedToolChoice,
    ToolDef,
    not_starting_with,
    prompt_messages,
    tool_plan,
)
from gclm.server.settings import ServerSettings

pytestmark = pytest.mark.anyio

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    ToolDef.model_validate({"type": "function", "function": {"name": n, "parameters": p}})
    for n, p in (("get_weather", WEATHER), ("now", None))
]
CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}'
NAMED = NamedToolChoice.model_validate({"type": "function", "function": {"name": "now"}})


def full(pattern: str, text: str) -> bool:
    return re.fullmatch(pattern, text) is not None


@pytest.mark.parametrize(
    ("text", "ok"),
    [("Hi", True), ("<", True), ("<tool_cal", True), ("<tool_calx", True), ("<b>", True)]
    + [(OPENER, False), (OPENER + "[", False), (OPENER + " text", False)],
)
def test_text_branch_is_text_that_does_not_start_with_the_opener(text: str, ok: bool) -> None:
    assert full(not_starting_with(OPENER), text) is ok


def test_required_is_the_opener_and_one_or_more_calls() -> None:
    regex = tool_plan(TOOLS, "required", None).regex()
    assert full(regex, f"{OPENER}[{CALL}]")
    assert full(regex, f'{OPENER}[{CALL}, {{"name": "now", "arguments": {{}}}}]')
    assert not full(regex, f"{OPENER}[]")
    assert not full(regex, "I will not call")
    assert not full(regex, f'{OPENER}[{{"name": "nope", "arguments": {{}}}}]')
    assert not full(regex, OPENER + '[{"name": "get_weather", "arguments": {"city": "Paris"}}]')
    assert not full(regex, f'{OPENER}[{{"name": "now", "arguments": {{"x": 1}}}}]')


def test_named_and_not_parallel_allow_exactly_one_call() -> None:
    one = tool_plan(TOOLS, "required", False).regex()
    assert full(one, f"{OPENER}[{CALL}]")
    assert not full(one, f"{OPENER}[{CALL}, {CALL}]")
    named = tool_plan(TOOLS, NAMED, None).regex()
    assert full(named, f'{OPENER}[{{"name": "now", "arguments": {{}}}}]')
    assert not full(named, f"{OPENER}[{CALL}]")


def test_auto_is_text_or_a_complete_call() -> None:
    regex = tool_plan(TOOLS, "auto", None).regex()
    assert full(regex, "Sunny, probably.")
    assert full(regex, f"{OPENER}[{CALL}]")
    assert not full(regex, f"{OPENER}[{CALL}")  # a cut-off call is not an output


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        (None, "required", "tool_choice"),
        (None, NAMED, "tool_choice"),
        (TOOLS[:1], NAMED, "tool_choice.function.name"),
        ([TOOLS[0], TOOLS[0]], "auto", "tools[1].function.name"),
    ],
)
def test_tool_choice_it_cannot_honour_is_refused(tools: Any, choice: Any, param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        tool_plan(tools, choice, None)
    assert caught.value.param == param


def test_no_tools_and_a_neutral_choice_is_no_plan() -> None:
    assert tool_plan(None, "auto", None) is None
    assert tool_plan(None, "none", None) is None


def read_all(text: str, step: int) -> tuple[CallReader, str, list[tuple[Any, ...]]]:
    reader = CallReader()
    content, events = "", []
    for i in range(0, len(text), step):
        c, e = reader.feed(text[i : i + step])
        content += c
        events += e
    return reader, content + reader.finish(), events


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_reader_reads_calls_in_any_pieces(step: int) -> None:
    text = f'{OPENER}[{CALL}, {{"name": "now", "arguments": {{"a": "}}]\\""}}}}]'
    reader, content, events = read_all(text, step)
    assert content == ""
    assert [(c.name, json.loads(c.arguments)) for c in reader.calls] == [
        ("get_weather", {"city": "Paris", "unit": "c"}),
        ("now", {"a": '}]"'}),
    ]
    assert all(c.id.startswith("call_") for c in reader.calls)
    # The name of a call comes before any of its arguments, and the fragments add up.
    assert events.index(("call", 1)) < min(i for i, e in enumerate(events) if e[:2] == ("args", 1))
    for i, call in enumerate(reader.calls):
        assert "".join(e[2] for e in events if e[:2] == ("args", i)) == call.arguments


@pytest.mark.parametrize("text", ["Hello there", "<", "<tool_cal", "<b>bold</b>"])
def test_reader_passes_text_through(text: str) -> None:
    for step in (1, 2, 100):
        reader, content, events = read_all(text, step)
        assert (content, events, reader.calls) == (text, [], [])


def test_history_renders_calls_and_results_in_the_format() -> None:
    plan = tool_plan(TOOLS, "auto", None)
    call = {"id": "call_1", "type": "function", "function": {"name": "now", "arguments": "{}"}}
    messages = prompt_messages(
        [
            {"role": "user", "content": "Time?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": "12:00", "tool_call_id": "call_1"},
            {"role": "tool", "content": "UTC", "tool_call_id": "call_1"},
        ],
        TOOLS,
        plan,
    )
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert '"name": "get_weather"' in messages[0]["content"]
    assert messages[2]["content"] == f'{OPENER}[{{"name": "now", "arguments": {{}}}}]'
    assert messages[3]["content"].count("<tool_response>") == 2


@functools.cache
def auto_table() -> tuple[CompiledTable, Any]:
    tokenizer = load_tokenizer()
    regex = tool_plan(TOOLS[:1], "auto", False).regex()
    return compile_constraint(
        Constraint.regex(regex), TokenVocabulary.from_tokenizer(tokenizer)
    ), tokenizer


def test_auto_opener_only_while_a_call_still_fits() -> None:
    """The budget rule on the real vocabulary: the token that completes the opener is
    allowed exactly when the tokens left after it can still complete the call."""
    table, tokenizer = auto_table()
    assert table.min_tokens == 1  # text: any answer of one token
    state = ConstraintState(table)
    *head, last = tokenizer.encode(OPENER)
    for token in head:
        state.advance(token, None)
    assert state.is_accepting  # "<tool_call" is still text
    after = state.masks.next_state(state.state, last)
    need = state.masks.dist(after)  # the call's tokens after the opener
    assert need > 5
    for tokens_left in range(1, need + 4):
        row = state.masks.row(state.state, tokens_left)
        allowed = bool(row[last // 32] >> (last % 32) & 1)
        assert allowed is (tokens_left - 1 >= need), tokens_left


SCRIPT = (
    OPENER,
    "[",
    '{"name": "get_weather", "arguments": ',
    '{"city": "Pa',
    'ris", ',
    '"unit": "c"}}]',
)


async def test_http_shapes_over_the_fake_engine(tmp_path) -> None:
    engine = FakeEngine(lambda request: SCRIPT)
    app = create_app(engine, ServerSettings(cache_dir=tmp_path))
    tools = [t.model_dump(exclude_none=True) for t in TOOLS]
    messages = [{"role": "user", "content": "Weather?"}]
    async with openai_client(app) as client:
        done = await client.chat.completions.create(
            model="gclm-fake", messages=messages, tools=tools, tool_choice="required", n=2
        )
        for choice in done.choices:
            assert choice.finish_reason == "tool_calls"
            assert choice.message.content is None
            (call,) = choice.message.tool_calls
            assert call.id.startswith("call_") and call.type == "function"
            assert call.function.name == "get_weather"
            assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "c"}
        stream = await client.chat.completions.create(
            model="gclm-fake", messages=messages, tools=tools, stream=True
        )
        deltas = [c.choices[0] async for c in stream if c.choices]
        calls = [d.delta.tool_calls[0] for d in deltas if d.delta.tool_calls]
        assert calls[0].id.startswith("call_") and calls[0].function.name == "get_weather"
        assert all(c.id is None and c.index == 0 for c in calls[1:])
        assert len(calls) > 2  # the arguments come in fragments
        assert json.loads("".join(c.function.arguments for c in calls)) == {
            "city": "Paris",
            "unit": "c",
        }
        assert deltas[-1].finish_reason == "tool_calls"
        # The prompt describes the tools in gclm's format.
        assert "<tools>" in bytes(engine.submits[0].prompt_ids).decode()


async def test_text_held_back_as_a_call_is_streamed_at_its_end(tmp_path) -> None:
    """Under "auto", text that begins like the opener is held back until it cannot be a
    call; an answer that ends so is sent as content before the finish, not as a call."""
    engine = FakeEngine(lambda request: ("<tool", "_ca"), min_tokens=1)
    app = create_app(engine, ServerSettings(cache_dir=tmp_path))
    tools = [t.model_dump(exclude_none=True) for t in TOOLS]
    messages = [{"role": "user", "content": "Weather?"}]
    async with openai_client(app) as client:
        stream = await client.chat.completions.create(
            model="gclm-fake", messages=messages, tools=tools, stream=True
        )
        deltas = [c.choices[0] async for c in stream if c.choices]
        done = await client.chat.completions.create(
            model="gclm-fake", messages=messages, tools=tools
        )
    assert [(d.delta.content, d.finish_reason) for d in deltas] == [
        (None, None),  # the role alone: the answer may still be a call
        ("<tool_ca", None),
        (None, "stop"),
    ]
    assert not any(d.delta.tool_calls for d in deltas)
    assert (done.choices[0].message.content, done.choices[0].finish_reason) == ("<tool_ca", "stop")


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": "T", "tool_choice": "bogus"}, "tool_choice"),
        ({"tools": "T", "tool_choice": {"type": "function"}}, "tool_choice"),
        (
            {"tools": "T", "tool_choice": {"type": "function", "function": {"name": "x" * 500}}},
            "tool_choice.function.name",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {
                                "type": "object",
                                "properties": {"a": {"type": "string", "pattern": "(?=x)"}},
                            },
                        },
                    }
                ]
            },
            "tools[0].function.parameters",
        ),
        (
            {"tools": "T", "extra_body": {"guided_regex": "a+"}, "tool_choice": "required"},
            "tools",
        ),
    ],
)
async def test_bad_tool_requests_get_a_short_400(app, kwargs: dict, param: str) -> None:
    if kwargs.get("tools") == "T":
        kwargs["tools"] = [t.model_dump(exclude_none=True) for t in TOOLS]
    async with openai_client(app) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model="gclm-fake", messages=[{"role": "user", "content": "x"}], **kwargs
            )
    assert caught.value.param == param
    assert len(caught.value.message) < 400


async def test_refused_fields_are_named_not_echoed(app) -> None:
    functions = [{"name": "f" * 60, "parameters": {"type": "object"}}] * 20
    async with openai_client(app) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model="gclm-fake",
                messages=[{"role": "user", "content": "x"}],
                functions=functions,  # type: ignore[arg-type]
            )
    assert caught.value.param == "functions"
    assert len(caught.value.message) < QUOTE_LIMIT + 120  # named and quoted, not echoed


@pytest.mark.parametrize("choice", ["auto", "none", None])
async def test_free_text_cut_by_the_budget_is_length(tmp_path, choice: str | None) -> None:
    """Whatever tool_choice: under "auto" the text is constrained (text or a call) and the
    engine reports the cut as a complete "stop" with budget_cut; it is still cut text."""
    engine = FakeEngine(lambda request: ("Sun", "ny", " and", " warm"), min_tokens=1)
    app = create_app(engine, ServerSettings(cache_dir=tmp_path))
    tools = [t.model_dump(exclude_none=True) for t in TOOLS] if choice else None
    kwargs: dict[str, Any] = {"tools": tools, "tool_choice": choice} if choice else {}
    messages = [{"role": "user", "content": "Weather?"}]
    async with openai_client(app) as client:
        done = await client.chat.completions.create(
            model="gclm-fake", messages=messages, max_tokens=2, **kwargs
        )
        stream = await client.chat.completions.create(
            model="gclm-fake", messages=messages, max_tokens=2, stream=True, **kwargs
        )
        reasons = [c.choices[0].finish_reason async for c in stream if c.choices]
        ended = await client.chat.completions.create(
            model="gclm-fake", messages=messages, max_tokens=5, **kwargs
        )
    assert (engine.submits[0].constraint is not None) is (choice == "auto")
    assert done.choices[0].finish_reason == "length"
    assert done.choices[0].message.content == "Sunny"
    assert reasons[-1] == "length"
    assert ended.choices[0].finish_reason == "stop"  # the model ended within its budget


async def test_usage_details(tmp_path) -> None:
    engine = FakeEngine()
    app = create_app(engine, ServerSettings(cache_dir=tmp_path))
    messages = [{"role": "user", "content": "Weather?"}]
    async with openai_client(app) as client:
        first = await client.chat.completions.create(model="gclm-fake", messages=messages, n=2)
        again = await client.chat.completions.create(model="gclm-fake", messages=messages)
        stream = await client.chat.completions.create(
            model="gclm-fake",
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
        )
        [streamed] = [c.usage async for c in stream if c.usage is not None]
        response = await client.responses.create(model="gclm-fake", input="Weather?")
    prompt = len(engine.submits[0].prompt_ids)
    assert first.usage is not None and again.usage is not None
    # n=2 shares one prompt: its tokens count once, as the first choice found them (none).
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == prompt - 1
    assert streamed.prompt_tokens_details.cached_tokens == prompt - 1
    for usage in (first.usage, again.usage, streamed):
        assert usage.completion_tokens_details.reasoning_tokens == 0
    assert response.usage is not None
    assert response.usage.input_tokens_details.cached_tokens == prompt - 1
    assert response.usage.output_tokens_details.reasoning_tokens == 0


def test_max_calls_bounds_the_parallel_calls() -> None:
    plan = tool_plan(TOOLS, "required", None)
    two = dataclasses.replace(plan, max_calls=2).regex()
    assert full(two, f"{OPENER}[{CALL}]") and full(two, f"{OPENER}[{CALL}, {CALL}]")
    assert not full(two, f"{OPENER}[{CALL}, {CALL}, {CALL}]")
    assert full(plan.regex(), f"{OPENER}[{CALL}, {CALL}, {CALL}]")
    one = dataclasses.replace(plan, max_calls=1).regex()
    assert full(one, f"{OPENER}[{CALL}]") and not full(one, f"{OPENER}[{CALL}, {CALL}]")
