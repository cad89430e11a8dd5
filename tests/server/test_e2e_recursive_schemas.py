"""End to end: JSON Schemas whose `$ref`s recurse, served by the pushdown masks
(compiler/grown/pushdown.py) on a real `gclm serve` (embedded model) with the openai SDK:
pushed by logit_bias, outputs nest as deep as the budget allows, validate with `jsonschema`,
and stop within max_tokens."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"
# name: (schema, the characters of the tokens pushed, the character that opens a level)
SCHEMAS: dict[str, tuple[dict[str, Any], str, str]] = {
    "nested_lists": (
        {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#"}}]},
        "[",
        "[",
    ),
    "object_chain": (
        {
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {
                        "c": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/node"}]},
                    },
                    "required": ["c"],
                }
            },
            "$ref": "#/$defs/node",
        },
        '{"',
        "{",
    ),
}


def nesting(text: str, opener: str) -> int:
    closer = {"[": "]", "{": "}"}[opener]
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped = not escaped and ch == "\\"
            in_string = escaped or ch != '"'
        elif ch == '"':
            in_string = True
        elif ch == opener:
            depth += 1
            deepest = max(deepest, depth)
        elif ch == closer:
            depth -= 1
    return deepest


@pytest.mark.parametrize("name", SCHEMAS)
def test_recursive_refs_nest_as_deep_as_the_budget_allows(
    name: str, client: openai.OpenAI, embedded_tokenizer: Any
) -> None:
    """logit_bias pushes the tokens that open a level (made of the opening text's
    characters, the opener among them), and holds back those with a blank, which the
    schemas allow between tokens: the budget goes to nesting."""
    schema, pushed, opener = SCHEMAS[name]
    bias = {}
    for token, i in embedded_tokenizer.get_vocab().items():
        text = embedded_tokenizer.convert_tokens_to_string([token])
        if text and text != text.replace(" ", "").replace("\n", ""):
            bias[str(i)] = -100
        elif text and opener in text and set(text) <= set(pushed):
            bias[str(i)] = 100
    done = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Nest deeply."}],
        response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema}},
        logit_bias=bias,
        max_tokens=96,
        temperature=0,
    )
    text = done.choices[0].message.content
    jsonschema.validate(json.loads(text), schema)
    assert done.choices[0].finish_reason == "stop"
    assert done.usage.completion_tokens <= 96
    assert nesting(text, opener) >= 8, text


def test_refs_that_inline_past_the_limit_are_served_as_calls(client: openai.OpenAI) -> None:
    """No recursion, but d0 holds two d1s, d1 two d2s, ... 15 deep: inlined, a regex of
    about 4 M characters (over the limit, refused before); served with every $ref a call,
    the answer validates and stops within max_tokens."""
    defs: dict[str, Any] = {
        f"d{i}": {
            "type": "object",
            "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}, "b": {"$ref": f"#/$defs/d{i + 1}"}},
            "required": ["a"],
        }
        for i in range(15)
    }
    defs["d15"] = {"type": "integer", "minimum": 0, "maximum": 9}
    schema = {"$defs": defs, "$ref": "#/$defs/d0"}
    for max_tokens in (64, 160):
        answers_within(client, schema, max_tokens)


def answers_within(client: openai.OpenAI, schema: dict[str, Any], max_tokens: int) -> None:
    """A request with `schema` is answered: valid, stopped, within `max_tokens`."""
    done = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Fill it in."}],
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
        max_tokens=max_tokens,
        temperature=0,
    )
    jsonschema.validate(json.loads(done.choices[0].message.content), schema)
    assert done.choices[0].finish_reason == "stop"
    assert done.usage.completion_tokens <= max_tokens


def test_a_schema_past_the_limit_without_refs_is_served_split(client: openai.OpenAI) -> None:
    """No $ref: 40 optional properties, each an object of 40 optional digits. Written as
    one regex, about 42 M characters (over the limit, refused before); served with the
    inner object a frame of its own, called from each property, the answer validates
    and stops within max_tokens."""
    inner = {
        "type": "object",
        "properties": {f"q{j}": {"type": "integer", "minimum": 0, "maximum": 9} for j in range(40)},
        "additionalProperties": False,
    }
    schema = {
        "type": "object",
        "properties": {f"p{i}": inner for i in range(40)},
        "additionalProperties": False,
    }
    for max_tokens in (32, 128):
        answers_within(client, schema, max_tokens)
