"""Custom tools on chat completions without a model: the constraint's regex (checked
against lark), the output reader, and the HTTP shapes with the openai SDK over the fake
engine, streamed and not."""

from __future__ import annotations

import dataclasses
import re

import lark
import openai
import pytest
from fake_engine import FakeEngine
from harness import openai_client

from gclm.compiler.grown.pushdown import PushdownTable
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.errors import ConstraintError, InvalidRequestError
from gclm.server.app import create_app
from gclm.server.openai.tools.calls import CallReader
from gclm.server.openai.tools.prompt import (
    OPENER,
    CallFormat,
    NamedToolChoice,
    ToolCallIn,
    ToolDef,
    call_text,
    tool_plan,
)
from gclm.server.settings import ServerSettings

pytestmark = pytest.mark.anyio

MATH = r"""
start: expr
expr: NUMBER (("+" | "*") NUMBER)*
%import common.NUMBER
%import common.WS_INLINE
%ignore WS_INLINE
"""


def custom(name: str, fmt: dict | None) -> dict:
    body: dict = {"name": name, "description": f"the {name} tool"}
    if fmt is not None:
        body["format"] = fmt
    return {"type": "custom", "custom": body}


TOOLS = [
    {"type": "function", "function": {"name": "now", "parameters": None}},
    custom("math", {"type": "grammar", "grammar": {"syntax": "lark", "definition": MATH}}),
    custom("zip", {"type": "grammar", "grammar": {"syntax": "regex", "definition": "[0-9]{5}"}}),
    custom("note", {"type": "text"}),
]
# Every single byte a token, and EOS.
BYTES = TokenVocabulary((*(bytes([b]) for b in range(256)), None), 256, "plain")
DEFS = [ToolDef.model_validate({k: v for k, v in t.items() if v is not None}) for t in TOOLS]
NAMED_MATH = NamedToolChoice.model_validate({"type": "custom", "custom": {"name": "math"}})


def full(pattern: str, text: str) -> bool:
    return re.fullmatch(pattern, text) is not None


def test_a_named_custom_tool_is_its_name_and_input_in_its_grammar() -> None:
    regex = tool_plan(DEFS, NAMED_MATH, None).regex()
    checker = lark.Lark(MATH, parser="earley", lexer="dynamic_complete")
    for text in ("1+2", "3 * 4 + 5", "7"):
        assert full(regex, f"{OPENER}math\n{text}")
        checker.parse(text)  # lark agrees
    assert not full(regex, f"{OPENER}math\n1+")
    assert not full(regex, f"{OPENER}zip\n12345")
    assert not full(regex, "no call")


def test_auto_allows_text_functions_and_every_custom_tool() -> None:
    regex = tool_plan(DEFS, "auto", None).regex()
    assert full(regex, "Just text")
    assert full(regex, f'{OPENER}[{{"name": "now", "arguments": {{}}}}]')
    assert full(regex, f"{OPENER}zip\n75001")
    assert not full(regex, f"{OPENER}zip\n7500")
    assert full(regex, f"{OPENER}note\nany text at all\nover lines")
    assert not full(regex, f"{OPENER}nope\nx")


def test_a_grammar_that_does_not_compile_names_the_tool_and_the_line() -> None:
    bad = ToolDef.model_validate(
        custom("bad", {"type": "grammar", "grammar": {"syntax": "lark", "definition": 's: "a"'}})
    )
    with pytest.raises(ConstraintError, match="custom tool 'bad'.*no rule named 'start'") as e:
        tool_plan([DEFS[0], bad], "auto", None).regex()  # type: ignore[union-attr]
    assert e.value.param == "tools[1].custom.format.grammar"


def test_a_named_tool_of_the_wrong_type_is_refused() -> None:
    wrong = NamedToolChoice.model_validate({"type": "function", "function": {"name": "math"}})
    with pytest.raises(InvalidRequestError, match="function tool 'math'") as e:
        tool_plan(DEFS, wrong, None)
    assert e.value.param == "tool_choice.function.name"


def test_the_reader_streams_a_custom_call() -> None:
    reader = CallReader()
    events = []
    for piece in ("<tool_", "call>ma", "th\n1 ", "+ 2"):
        content, new = reader.feed(piece)
        assert content == ""
        events += new
    (call,) = reader.calls
    assert call.custom and call.name == "math" and call.arguments == "1 + 2"
    assert events[0] == ("call", 0)
    assert "".join(e[2] for e in events[1:]) == "1 + 2"


def test_history_writes_custom_calls_back_in_the_format() -> None:
    calls = [
        ToolCallIn.model_validate(
            {"id": "c1", "type": "custom", "custom": {"name": "zip", "input": "75001"}}
        )
    ]
    assert call_text(calls) == f"{OPENER}zip\n75001"


SCRIPT = ("<tool_call>", "math\n", "2 +", " 3")


async def test_http_shapes_over_the_fake_engine(tmp_path) -> None:
    engine = FakeEngine(lambda request: SCRIPT)
    app = create_app(engine, ServerSettings(cache_dir=tmp_path))
    messages = [{"role": "user", "content": "Add 2 and 3"}]
    async with openai_client(app) as client:
        done = await client.chat.completions.create(
            model="gclm-fake",
            messages=messages,
            tools=TOOLS,
            tool_choice={"type": "custom", "custom": {"name": "math"}},
        )
        choice = done.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.type == "custom" and call.id.startswith("call_")
        assert (call.custom.name, call.custom.input) == ("math", "2 + 3")
        # The constraint is the named tool's: its grammar, not the others.
        regex = engine.compiles[0].spec
        assert full(regex, f"{OPENER}math\n2 + 3") and not full(regex, f"{OPENER}zip\n75001")

        stream = await client.chat.completions.create(
            model="gclm-fake",
            messages=messages,
            tools=TOOLS,
            tool_choice="required",
            stream=True,
        )
        deltas = [c.choices[0] async for c in stream if c.choices]
        calls = [d.delta.tool_calls[0] for d in deltas if d.delta.tool_calls]
        assert calls[0].id.startswith("call_") and calls[0].type == "custom"
        assert calls[0].model_extra["custom"]["name"] == "math"
        assert "".join(c.model_extra["custom"]["input"] for c in calls) == "2 + 3"
        assert deltas[-1].finish_reason == "tool_calls"

        # The result comes back as a tool message; the next turn is accepted.
        history = [
            *messages,
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "5"},
        ]
        await client.chat.completions.create(
            model="gclm-fake", messages=history, tools=TOOLS, tool_choice="none"
        )
    prompt = engine.chats[-1]
    assert f"{OPENER}math\n2 + 3" in prompt[-2]["content"]
    assert "<tool_response>\n5\n</tool_response>" in prompt[-1]["content"]


async def test_a_bad_grammar_is_a_400_naming_the_tool(tmp_path) -> None:
    app = create_app(FakeEngine(), ServerSettings(cache_dir=tmp_path))
    bad = custom(
        "bad", {"type": "grammar", "grammar": {"syntax": "lark", "definition": 'start: "a" x'}}
    )
    async with openai_client(app) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model="gclm-fake",
                messages=[{"role": "user", "content": "x"}],
                tools=[TOOLS[0], bad],
            )
    assert caught.value.param == "tools[1].custom.format.grammar"
    assert "line 1: the rule 'x' is not defined" in caught.value.message


RESPONSES_TOOLS = [
    {"type": "function", "name": "now", "parameters": None},
    {
        "type": "custom",
        "name": "math",
        "description": "adds",
        "format": {"type": "grammar", "syntax": "lark", "definition": MATH},
    },
]


async def test_responses_custom_tool_over_the_fake_engine(tmp_path) -> None:
    engine = FakeEngine(lambda request: SCRIPT)
    app = create_app(engine, ServerSettings(cache_dir=tmp_path))
    async with openai_client(app) as client:
        done = await client.responses.create(
            model="gclm-fake",
            input="Add 2 and 3",
            tools=RESPONSES_TOOLS,
            tool_choice={"type": "custom", "name": "math"},
        )
        (item,) = done.output
        assert item.type == "custom_tool_call" and item.status == "completed"
        assert (item.name, item.input) == ("math", "2 + 3")
        assert item.call_id.startswith("call_") and item.id.startswith("ctc_")

        events = [
            e
            async for e in await client.responses.create(
                model="gclm-fake",
                input="Add",
                tools=RESPONSES_TOOLS,
                tool_choice="required",
                stream=True,
            )
        ]
        kinds = [e.type for e in events]
        deltas = [e.delta for e in events if e.type == "response.custom_tool_call_input.delta"]
        assert "".join(deltas) == "2 + 3"
        (finished,) = [e for e in events if e.type == "response.custom_tool_call_input.done"]
        assert finished.input == "2 + 3"
        assert kinds.index("response.output_item.added") < kinds.index(
            "response.custom_tool_call_input.delta"
        )
        assert kinds[-1] == "response.completed"

        # The next turn sends the call and its output back as input items.
        await client.responses.create(
            model="gclm-fake",
            input=[
                {"role": "user", "content": "Add 2 and 3"},
                {
                    "type": "custom_tool_call",
                    "call_id": item.call_id,
                    "name": "math",
                    "input": item.input,
                },
                {"type": "custom_tool_call_output", "call_id": item.call_id, "output": "5"},
            ],
            tools=RESPONSES_TOOLS,
            tool_choice="none",
        )
    prompt = engine.chats[-1]
    assert f"{OPENER}math\n2 + 3" in prompt[-2]["content"]
    assert "<tool_response>\n5\n</tool_response>" in prompt[-1]["content"]


async def test_responses_bad_grammar_names_the_tool_format(tmp_path) -> None:
    app = create_app(FakeEngine(), ServerSettings(cache_dir=tmp_path))
    bad = {
        "type": "custom",
        "name": "bad",
        "format": {"type": "grammar", "syntax": "lark", "definition": "start: x"},
    }
    async with openai_client(app) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(model="gclm-fake", input="x", tools=[bad])
    assert caught.value.param == "tools[0].format"
    assert "line 1: the rule 'x' is not defined" in caught.value.message


# Several calls in one turn (parallel calls, custom tools among the tools).
EXPR = 'start: e\ne: "(" e ")" | NUMBER ("+" NUMBER)*\n%import common.NUMBER'
# Its texts can hold the separator ("a\n<tool_call>"): its input runs to the end.
TAGS = 'start: item+\nitem: "<" NAME ">" | NAME | "(" item ")"\nNAME: /[a-z_]+/\n%ignore /\\n/'
SEVERAL = [
    *DEFS,
    ToolDef.model_validate(
        custom("expr", {"type": "grammar", "grammar": {"syntax": "lark", "definition": EXPR}})
    ),
    ToolDef.model_validate(
        custom("tags", {"type": "grammar", "grammar": {"syntax": "lark", "definition": TAGS}})
    ),
]
NOW = f'{OPENER}[{{"name": "now", "arguments": {{}}}}]'


def test_several_calls_follow_one_another_each_after_its_opener() -> None:
    plan = tool_plan(SEVERAL, "required", None)
    assert plan is not None and plan.several
    constraint, how = plan.constraint()
    assert how == CallFormat(True, frozenset({"tags"}))
    regex = constraint.spec
    assert full(regex, f"{NOW}\n{OPENER}math\n1+2\n{OPENER}note\nfree\ntext\n{OPENER}zip\n75001")
    assert full(regex, f"{OPENER}zip\n75001\n{OPENER}tags\na\n<tool_call>b")  # tags last
    assert full(regex, f"{OPENER}note\nends like <tool_call\n{OPENER}zip\n75001")
    assert not full(regex, f"{OPENER}tags\na\n{OPENER}zip\n75001")  # nothing after tags
    assert not full(regex, f"{OPENER}note\nholds\n{OPENER}nope")  # a note never holds it
    assert not full(regex, f"{NOW}\n")
    # One call at a time without parallel calls, as before: a custom input runs to the end.
    one = tool_plan(SEVERAL, "required", False)
    assert one is not None and not one.several
    assert one.constraint()[1] == CallFormat(False, frozenset(c.name for c in one.customs))
    assert full(one.regex(), f"{OPENER}note\nholds\n{OPENER}anything")
    assert not full(one.regex(), f"{OPENER}zip\n75001\n{OPENER}zip\n75001")


def test_max_tool_calls_counts_every_call_of_the_turn() -> None:
    plan = dataclasses.replace(tool_plan(SEVERAL, "required", None), max_calls=2)
    regex = plan.regex()
    assert full(regex, f"{NOW}\n{OPENER}zip\n75001")
    assert not full(regex, f"{NOW}\n{OPENER}zip\n75001\n{OPENER}zip\n75001")
    call = '{"name": "now", "arguments": {}}'
    assert not full(regex, f"{OPENER}[{call}, {call}]")  # each list holds one call


def test_recursive_grammars_are_called_not_unrolled() -> None:
    plan = tool_plan(SEVERAL, "required", None)
    constraint, _ = plan.constraint()  # type: ignore[union-attr]
    assert constraint.calls == (EXPR, TAGS)
    deep = "(" * 30 + "1+2" + ")" * 30
    text = f"{OPENER}expr\n{deep}\n{OPENER}zip\n75001"
    assert not full(constraint.spec, text)  # unrolled: 3 deep at most
    table = PushdownTable.of_constraint(dataclasses.replace(constraint, pushdown=True), BYTES)
    assert table is not None
    assert walks(table, text) and not walks(table, text.replace(")", "", 1))
    assert walks(table, f"{OPENER}tags\n" + "(" * 20 + "a" + ")" * 20 + "\n<tool_call>b")


def walks(table: PushdownTable, text: str) -> bool:
    return table.grown.accepts(text.encode())


def test_the_reader_splits_calls_at_the_separator_in_any_pieces() -> None:
    how = CallFormat(True, frozenset({"tags"}))
    text = f"{NOW}\n{OPENER}math\n1+2\n{OPENER}note\na\n<tool\n\n{OPENER}tags\nx\n<tool_call>y"
    for size in (1, 2, 3, 5, 7, len(text)):
        reader = CallReader(how)
        args: dict[int, str] = {}
        for at in range(0, len(text), size):
            content, events = reader.feed(text[at : at + size])
            assert content == ""
            for e in events:
                if e[0] == "args":
                    args[e[1]] = args.get(e[1], "") + e[2]
        for e in reader.release():
            args[e[1]] = args.get(e[1], "") + e[2]
        assert [(c.name, c.custom) for c in reader.calls] == [
            ("now", False), ("math", True), ("note", True), ("tags", True),
        ]  # fmt: skip
        assert [c.arguments for c in reader.calls] == ["{}", "1+2", "a\n<tool\n", "x\n<tool_call>y"]
        assert args == {i: c.arguments for i, c in enumerate(reader.calls)}
    # A separated input the output ends in the middle of a separator's start keeps it.
    reader = CallReader(how)
    reader.feed(f"{OPENER}note\nhi\n<tool_ca")
    assert reader.calls[0].arguments == "hi"
    assert reader.release() == [("args", 0, "\n<tool_ca")]
    assert reader.calls[0].arguments == "hi\n<tool_ca"


SEVERAL_SCRIPT = (
    "<tool_call>",
    '[{"name": "now", "arguments": {}}]',
    "\n<tool_call>math\n2",
    " + 3\n<tool",
    "_call>note\nhi\n<to",
)


async def test_several_calls_over_http_streamed_and_not(tmp_path) -> None:
    engine = FakeEngine(lambda request: SEVERAL_SCRIPT)
    app = create_app(engine, ServerSettings(cache_dir=tmp_path))
    messages = [{"role": "user", "content": "Do three things"}]
    expected = [("now", "{}"), ("math", "2 + 3"), ("note", "hi\n<to")]
    async with openai_client(app) as client:
        done = await client.chat.completions.create(
            model="gclm-fake", messages=messages, tools=TOOLS, tool_choice="required"
        )
        calls = done.choices[0].message.tool_calls
        read = [
            (c.function.name, c.function.arguments) if c.type == "function" else
            (c.custom.name, c.custom.input)
            for c in calls
        ]  # fmt: skip
        assert read == expected and done.choices[0].finish_reason == "tool_calls"
        assert len({c.id for c in calls}) == 3

        stream = await client.chat.completions.create(
            model="gclm-fake", messages=messages, tools=TOOLS, tool_choice="required", stream=True
        )
        pieces: dict[int, list[str]] = {}
        names: dict[int, str] = {}
        async for chunk in stream:
            for d in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
                body = d.function.model_dump() if d.function else d.model_extra["custom"]
                if body.get("name"):
                    names[d.index] = body["name"]
                pieces.setdefault(d.index, []).append(
                    body.get("arguments") or body.get("input") or ""
                )
        assert [(names[i], "".join(pieces[i])) for i in sorted(names)] == expected

        response = await client.responses.create(
            model="gclm-fake",
            input="Do three things",
            tools=[*RESPONSES_TOOLS, {"type": "custom", "name": "note"}],
            tool_choice="required",
        )
        assert [(i.type, i.name) for i in response.output] == [
            ("function_call", "now"), ("custom_tool_call", "math"), ("custom_tool_call", "note"),
        ]  # fmt: skip
        assert response.output[2].input == "hi\n<to"
    # The turn's history writes the calls back as the model wrote them.
    history = [
        *messages,
        {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]},
    ]
    async with openai_client(app) as client:
        await client.chat.completions.create(
            model="gclm-fake", messages=history, tools=TOOLS, tool_choice="none"
        )
    assert any("".join(SEVERAL_SCRIPT) in (m["content"] or "") for m in engine.chats[-1])
