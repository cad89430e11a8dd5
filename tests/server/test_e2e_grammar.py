"""End to end: grammars on a real `gclm serve` (embedded model) with the openai SDK, and
lark as the independent checker: `structured_outputs.grammar` at every budget from the
minimum up, custom tools streamed and not, and every Python block of docs/grammars.md."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import lark
import openai
import pytest

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"
DOC = Path(__file__).resolve().parents[2] / "docs" / "grammars.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)
DOCUMENTED_URL = "http://127.0.0.1:8000/v1"
LIST = r"""
start: "[" item ("," item)* "]"
item: SIGNED_NUMBER | ESCAPED_STRING | "(" item ")"
%import common (SIGNED_NUMBER, ESCAPED_STRING, WS)
%ignore WS
"""
TOOL = {
    "type": "custom",
    "custom": {
        "name": "items",
        "format": {"type": "grammar", "grammar": {"syntax": "lark", "definition": LIST}},
    },
}
ASK = [{"role": "user", "content": "List three numbers."}]


def checker(grammar: str) -> lark.Lark:
    return lark.Lark(grammar, parser="earley", lexer="dynamic_complete")


def minimum(create: Any, **request: Any) -> int:
    """The request's minimum budget, read from the 400 that max_tokens=1 earns."""
    with pytest.raises(openai.BadRequestError) as caught:
        create(max_tokens=1, **request)
    assert caught.value.param == "max_tokens"
    return int(caught.value.message.split("needs ")[1].split()[0])


def test_structured_outputs_grammar_parses_at_every_budget(client: openai.OpenAI) -> None:
    parser = checker(LIST)
    request = {
        "model": MODEL,
        "prompt": "A list: ",
        "extra_body": {"structured_outputs": {"grammar": LIST}},
        "temperature": 1.0,
        "seed": 3,
    }
    low = minimum(client.completions.create, **request)
    for budget in range(low, low + 4):
        done = client.completions.create(max_tokens=budget, n=2, **request)
        for choice in done.choices:
            parser.parse(choice.text)  # raises if the text is outside the grammar
        assert done.usage.completion_tokens <= 2 * budget


# Recursion inside rules, served by the pushdown masks (compiler/grown/pushdown.py): name:
# (grammar, what opens a level, its closer).
NESTED = {
    "lists": (
        'start: value\nvalue: "[" (value ("," value)*)? "]" | DIGIT\n%import common.DIGIT',
        "[",
        "]",
    ),
    "calls": ('start: e\ne: "f(" e ("," e)* ")" | INT\n%import common.INT', "f(", ")"),
    "parens": ('start: t\nt: "(" t ")" | "x"', "(", ")"),
}


def nesting(text: str, opener: str, closer: str) -> int:
    depth = deepest = at = 0
    while at < len(text):
        if text.startswith(opener, at):
            depth += 1
            deepest = max(deepest, depth)
            at += len(opener)
            continue
        depth -= text[at] == closer
        at += 1
    return deepest


@pytest.mark.parametrize("name", NESTED)
def test_recursion_nests_as_deep_as_the_budget_allows(
    name: str, client: openai.OpenAI, embedded_tokenizer: Any
) -> None:
    """logit_bias pushes every token made of the opener's characters; with max_tokens 64 the output
    nests at least 10 deep (the unrolled regex stopped at 3), parses, and stops in time."""
    grammar, opener, closer = NESTED[name]
    vocab = embedded_tokenizer.get_vocab()
    openers = {
        str(i): 100
        for token, i in vocab.items()
        if (text := embedded_tokenizer.convert_tokens_to_string([token]))
        and set(text) <= set(opener)
    }
    assert openers, opener
    request = {
        "model": MODEL,
        "prompt": "Nested: ",
        "extra_body": {"structured_outputs": {"grammar": grammar}},
        "logit_bias": openers,
        "temperature": 0,
    }
    done = client.completions.create(max_tokens=64, **request)
    text = done.choices[0].text
    checker(grammar).parse(text)
    assert done.choices[0].finish_reason == "stop"
    assert done.usage.completion_tokens <= 64
    assert nesting(text, opener, closer) >= 10, text


def test_a_recursive_grammars_minimum_is_named_and_suffices(client: openai.OpenAI) -> None:
    grammar = 'start: t ";" t ";" t\nt: "(" t ")" | "Q"'
    request = {
        "model": MODEL,
        "prompt": "Nested: ",
        "extra_body": {"structured_outputs": {"grammar": grammar}},
        "temperature": 1.0,
        "seed": 1,
    }
    low = minimum(client.completions.create, **request)
    assert low > 1
    with pytest.raises(openai.BadRequestError, match=f"needs {low} "):
        client.completions.create(max_tokens=low - 1, **request)
    for budget in (low, low + 1, low + 5):
        done = client.completions.create(max_tokens=budget, n=3, **request)
        for choice in done.choices:
            checker(grammar).parse(choice.text)
            assert choice.finish_reason == "stop"


def test_custom_tool_calls_parse_streamed_and_not(client: openai.OpenAI) -> None:
    parser = checker(LIST)
    request = {
        "model": MODEL,
        "messages": ASK,
        "tools": [TOOL],
        "tool_choice": {"type": "custom", "custom": {"name": "items"}},
    }
    low = minimum(client.chat.completions.create, **request)
    for budget in (low, low + 8):
        done = client.chat.completions.create(max_tokens=budget, **request)
        (call,) = done.choices[0].message.tool_calls
        assert done.choices[0].finish_reason == "tool_calls" and call.type == "custom"
        parser.parse(call.custom.input)
    stream = client.chat.completions.create(max_tokens=low + 8, stream=True, **request)
    deltas = [c.choices[0] for c in stream if c.choices]
    calls = [d.delta.tool_calls[0] for d in deltas if d.delta.tool_calls]
    assert calls[0].type == "custom" and calls[0].model_extra["custom"]["name"] == "items"
    parser.parse("".join(c.model_extra["custom"]["input"] for c in calls))
    assert deltas[-1].finish_reason == "tool_calls"


def test_responses_custom_tool_parses_streamed_and_not(client: openai.OpenAI) -> None:
    parser = checker(LIST)
    tool = {
        "type": "custom",
        "name": "items",
        "format": {"type": "grammar", "syntax": "lark", "definition": LIST},
    }
    request = {
        "model": MODEL,
        "input": "List three numbers.",
        "tools": [tool],
        "tool_choice": {"type": "custom", "name": "items"},
    }
    done = client.responses.create(max_output_tokens=40, **request)
    (item,) = done.output
    assert item.type == "custom_tool_call" and item.status == "completed"
    parser.parse(item.input)
    events = list(client.responses.create(max_output_tokens=40, stream=True, **request))
    fragments = [e.delta for e in events if e.type == "response.custom_tool_call_input.delta"]
    parser.parse("".join(fragments))
    assert events[-1].type == "response.completed"


def biased(tokenizer: Any, chars: str) -> dict[str, int]:
    """logit_bias +100 on every token made only of `chars`."""
    return {
        str(i): 100
        for token, i in tokenizer.get_vocab().items()
        if (text := tokenizer.convert_tokens_to_string([token])) and set(text) <= set(chars)
    }


NEST = {"type": "custom", "custom": {"name": "nest", "format": {"type": "grammar", "grammar": {
    "syntax": "lark", "definition": NESTED["parens"][0]}}}}  # fmt: skip


def test_a_custom_tools_recursive_grammar_nests_as_deep_as_the_budget_allows(
    client: openai.OpenAI, embedded_tokenizer: Any
) -> None:
    """The custom tool's grammar is called from the tool call's constraint, not unrolled:
    pushed by logit_bias, its input nests 10 deep or more within max_tokens 64."""
    done = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[NEST],
        tool_choice={"type": "custom", "custom": {"name": "nest"}},
        logit_bias=biased(embedded_tokenizer, "("),
        temperature=0,
        max_tokens=64,
    )
    (call,) = done.choices[0].message.tool_calls
    checker(NESTED["parens"][0]).parse(call.custom.input)
    assert done.choices[0].finish_reason == "tool_calls"
    assert done.usage.completion_tokens <= 64
    assert nesting(call.custom.input, "(", ")") >= 10, call.custom.input


def test_several_custom_calls_in_one_turn(client: openai.OpenAI, embedded_tokenizer: Any) -> None:
    """Parallel calls allowed (the default), logit_bias on the newline that starts the next
    call's opener: the turn holds several calls, each input in its grammar, all within
    max_tokens; streamed, the same calls arrive in pieces."""
    request = {
        "model": MODEL,
        "messages": ASK,
        "tools": [NEST, TOOL],
        "tool_choice": "required",
        "logit_bias": biased(embedded_tokenizer, "\n"),
        "temperature": 0,
        "max_tokens": 64,
    }
    done = client.chat.completions.create(**request)
    calls = done.choices[0].message.tool_calls
    assert len(calls) >= 2, calls
    grammars = {"nest": NESTED["parens"][0], "items": LIST}
    for call in calls:
        checker(grammars[call.custom.name]).parse(call.custom.input)
    assert done.usage.completion_tokens <= 64
    stream = client.chat.completions.create(stream=True, **request)
    inputs: dict[int, str] = {}
    for chunk in stream:
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            inputs[d.index] = inputs.get(d.index, "") + d.model_extra["custom"]["input"]
    assert list(inputs.values()) == [c.custom.input for c in calls]


def test_doc_has_python_blocks() -> None:
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_doc_block_runs(index: int, gclm_server: Any) -> None:
    code = BLOCKS[index].replace(DOCUMENTED_URL, f"{gclm_server.url}/v1")
    printed = io.StringIO()
    scope: dict[str, Any] = {}
    with contextlib.redirect_stdout(printed):
        exec(compile(code, f"docs/grammars.md python block {index + 1}", "exec"), scope)  # noqa: S102
    lines = printed.getvalue().splitlines()
    assert lines, "each block shows its result with print()"
    if "MATH" in scope:
        assert lines[0] == "tool_calls custom calculator", lines
        checker(scope["MATH"]).parse(scope["call"].custom.input)
        assert lines[-1] == "True"
    elif "DATE" in scope:
        assert lines[0] == "custom_tool_call set_date", lines
        checker(scope["DATE"]).parse(scope["call"].input)
        assert lines[-1] == "True"
    else:
        checker(scope["GRAMMAR"]).parse(scope["answer"].choices[0].text)
