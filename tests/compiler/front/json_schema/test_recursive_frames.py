"""JSON Schemas whose `$ref`s recurse, kept as calls (compiler/front/json_schema/frames.py)
and served by the pushdown masks (compiler/grown/pushdown.py): instances of any depth are
accepted, every output validates with `jsonschema` and ends within its budget, and a
recursion the normaliser would have to read falls back to unrolling."""

from __future__ import annotations

import functools
import json
from typing import Any

import jsonschema
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.json_schema.frames import recursive_refs, schema_frames
from gclm.compiler.grown.pushdown import PushdownTable
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.masking import (
    ConstraintState,
    allocate_bitmask,
    apply_bitmask,
    check_budget,
    fill_bitmask,
)

VOCAB = TokenVocabulary(
    (*(bytes([b]) for b in range(256)), b'{"', b'":', b"null", b"[[", b"]]", None), 261, "plain"
)
TREE = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "kids": {"type": "array", "items": {"$ref": "#"}},
    },
    "required": ["n", "kids"],
}
LISTS = {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#"}}]}
CHAIN = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {"next": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/node"}]}},
            "required": ["next"],
        }
    },
    "$ref": "#/$defs/node",
}
# Two definitions that call each other.
MUTUAL = {
    "$defs": {
        "a": {"type": "array", "items": {"$ref": "#/$defs/b"}, "maxItems": 2},
        "b": {"anyOf": [{"type": "boolean"}, {"type": "object",
              "properties": {"a": {"$ref": "#/$defs/a"}}, "required": ["a"]}]},
    },
    "$ref": "#/$defs/a",
}  # fmt: skip
SCHEMAS = {"tree": TREE, "lists": LISTS, "chain": CHAIN, "mutual": MUTUAL}


@functools.cache
def table(name: str) -> PushdownTable:
    frames = schema_frames(Constraint.json_schema(SCHEMAS[name]))
    assert frames is not None and len(frames.bodies) >= 2
    return PushdownTable.of_frames(frames, VOCAB)


def accepts(t: PushdownTable, text: str) -> bool:
    return t.grown.accepts(text.encode())


def test_recursion_is_found_through_refs_only():
    assert recursive_refs(TREE) and recursive_refs(CHAIN) and recursive_refs(MUTUAL)
    flat = {"$defs": {"x": {"type": "integer"}}, "type": "array", "items": {"$ref": "#/$defs/x"}}
    assert not recursive_refs(flat)
    assert schema_frames(Constraint.json_schema(flat)) is None


def test_a_ref_met_with_other_keywords_is_unrolled_as_before():
    """A rewrite that must read the called definition (here a meet with `maxProperties`)
    keeps no call: the schema goes the unrolled way."""
    schema = {
        "type": "object",
        "properties": {"kid": {"$ref": "#", "maxProperties": 1}},
    }
    assert recursive_refs(schema)
    assert schema_frames(Constraint.json_schema(schema)) is None


def deep(name: str, depth: int) -> Any:
    if name == "tree":
        return {
            "n": depth,
            "kids": [] if depth == 0 else [deep(name, depth - 1), {"n": 1, "kids": []}],
        }
    if name == "lists":
        return depth if depth == 0 else [deep(name, depth - 1), 7]
    if name == "chain":
        return {"next": None if depth == 0 else deep(name, depth - 1)}
    return [] if depth == 0 else [True, {"a": deep(name, depth - 1)}]


@pytest.mark.parametrize("name", SCHEMAS)
@pytest.mark.parametrize("depth", [0, 1, 4, 12, 30])
def test_instances_of_any_depth_are_accepted(name, depth):
    value = deep(name, depth)
    jsonschema.validate(value, SCHEMAS[name])
    for text in (json.dumps(value, separators=(",", ":")), json.dumps(value)):
        assert accepts(table(name), text), text


@pytest.mark.parametrize("name", SCHEMAS)
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), extra=st.integers(0, 40), cut=st.integers(1, 200))
def test_outputs_validate_and_what_is_accepted_is_valid(name, seed, extra, cut):
    """Every output at a budget from the minimum up validates; a prefix of it is accepted
    only where it is a valid instance itself."""
    t = table(name)
    text = generate(t, t.request_minimum() + extra, seed)
    jsonschema.validate(json.loads(text), SCHEMAS[name])
    prefix = text[: min(cut, len(text) - 1)]
    if prefix and accepts(t, prefix):
        jsonschema.validate(json.loads(prefix), SCHEMAS[name])


def generate(t: PushdownTable, budget: int, seed: int, strength: float = 3.0) -> str:
    """One output through the masks with random logits; tokens that open an array or an
    object get `strength` more."""
    check_budget(t, budget)
    gen = torch.Generator().manual_seed(seed)
    state = ConstraintState(t)
    bitmask = allocate_bitmask(1, t.vocab_size)
    bias = torch.tensor(
        [strength if b and b[:1] in (b"[", b"{") else 0.0 for b in VOCAB.token_bytes]
    )
    out: list[int] = []
    left = budget
    while not state.must_stop(left):
        fill_bitmask(bitmask, 0, state, left)
        logits = torch.randn(1, t.vocab_size, generator=gen) * 2 + bias
        apply_bitmask(logits, bitmask)
        tok = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
        state.advance(tok, left)
        if state.finished:
            break
        out.append(tok)
        left -= 1
    assert len(out) <= budget and state.is_accepting
    return VOCAB.decode(out)


@pytest.mark.parametrize("name", ["lists", "chain"])
def test_pushed_outputs_nest_as_deep_as_the_budget_allows(name):
    text = generate(table(name), 96, 0, strength=50.0)
    deepest = depth = 0
    for ch in text:
        depth += ch in "[{"
        depth -= ch in "]}"
        deepest = max(deepest, depth)
    jsonschema.validate(json.loads(text), SCHEMAS[name])
    assert deepest >= 8, text


def test_definitions_that_inline_past_the_limit_are_each_written_once():
    """d0 holds two d1s, d1 two d2s, ... d12 a recursion: inlined, 2^12 copies (refused
    as too large); with every $ref a call, one frame a definition."""
    defs: dict[str, Any] = {
        f"d{i}": {
            "type": "object",
            "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}, "b": {"$ref": f"#/$defs/d{i + 1}"}},
        }
        for i in range(12)
    }
    defs["d12"] = {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#"}}]}
    schema = {"$defs": defs, "$ref": "#/$defs/d0"}
    c = Constraint.json_schema(schema)
    t = PushdownTable.of_constraint(c, VOCAB)
    assert t is not None
    value: Any = 1
    for _ in range(12):
        value = {"a": value, "b": value}
    jsonschema.validate(value, schema)
    assert accepts(t, json.dumps(value, separators=(",", ":")))
    assert not accepts(t, json.dumps(value, separators=(",", ":")).replace("1", '"x"', 1))


def doubling(depth: int) -> dict[str, Any]:
    """d0 holds two d1s, d1 two d2s, ... down to an integer: no recursion, and 2^depth
    copies of the leaf when inlined."""
    defs: dict[str, Any] = {
        f"d{i}": {
            "type": "object",
            "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}, "b": {"$ref": f"#/$defs/d{i + 1}"}},
            "required": ["a"],
        }
        for i in range(depth)
    }
    defs[f"d{depth}"] = {"type": "integer", "minimum": 0, "maximum": 9}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def test_refs_that_do_not_recurse_but_inline_past_the_limit_are_calls():
    """Asked for (the server asks where the inlined regex passed a limit), a schema whose
    $refs do not recurse has every $ref a call: one frame a definition, its language the
    schema's."""
    from gclm.compiler.front.regex import to_regex
    from gclm.errors import CompileLimitError

    schema = doubling(15)
    c = Constraint.json_schema(schema)
    assert not recursive_refs(schema)
    with pytest.raises(CompileLimitError, match="regex of about"):
        to_regex(c)
    t = PushdownTable.of_constraint(c, VOCAB)
    assert t is not None
    value: Any = 7
    for _ in range(15):
        value = {"a": value}
    jsonschema.validate(value, schema)
    assert accepts(t, json.dumps(value, separators=(",", ":")))
    assert not accepts(t, json.dumps(value, separators=(",", ":")).replace("7", "17"))
    assert not accepts(t, json.dumps(value, separators=(",", ":")).replace('{"a":7}', "{}"))
    for seed in range(5):
        text = generate(t, t.request_minimum() + 30, seed)
        jsonschema.validate(json.loads(text), schema)


def wide(n: int) -> dict[str, Any]:
    """n optional properties, each an object of n optional integers below 10: no $ref,
    and outlines-core's regex writes each optional property once per alternative that may
    hold it, n * n / 2 copies of the inner object's own n * n / 2."""
    inner = {
        "type": "object",
        "properties": {f"q{j}": {"type": "integer", "minimum": 0, "maximum": 9} for j in range(n)},
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {f"p{i}": inner for i in range(n)},
        "additionalProperties": False,
    }


def test_a_schema_past_the_limit_without_refs_is_split_into_frames():
    """Asked for (the server asks where the regex passed a limit), a schema with no $ref is
    split: each large subschema a frame, written once however often its caller repeats it;
    its language the schema's (in declared key order)."""
    from gclm.compiler.front.json_schema.frames import schema_frames
    from gclm.compiler.front.regex import to_regex
    from gclm.errors import CompileLimitError

    schema = wide(40)
    c = Constraint.json_schema(schema)
    with pytest.raises(CompileLimitError, match="regex of about"):
        to_regex(c)
    frames = schema_frames(c, split=True)
    assert frames is not None
    assert len(frames.bodies) == 2  # the outer object, and the inner one once
    assert schema_frames(c) is None  # no $ref: nothing to call unless split
    t = PushdownTable.of_constraint(c, VOCAB)
    assert t is not None
    valid = [{}, {"p3": {}}, {"p0": {"q1": 2}, "p39": {"q0": 0, "q39": 9}}]
    for value in valid:
        jsonschema.validate(value, schema)
        assert accepts(t, json.dumps(value, separators=(",", ":")))
    for text in ('{"p0":{"q1":12}}', '{"p0":{"q40":1}}', '{"p1":{},"p0":{}}', '{"p0":1}'):
        assert not accepts(t, text), text
    for seed in range(5):
        text = generate(t, t.request_minimum() + 40, seed)
        jsonschema.validate(json.loads(text), schema)


def test_a_grammar_whose_rules_recurse_on_the_left_through_each_other_is_unrolled():
    from gclm.compiler.front.regex import to_regex

    c = Constraint.grammar('start: a\na: b "x" | "y"\nb: a "z" | "w"')
    assert PushdownTable.of_constraint(c, VOCAB) is None
    assert to_regex(c).rewrites  # served as before: unrolled, with the note


@pytest.mark.parametrize("name", SCHEMAS)
def test_the_minimum_is_the_exact_one(name):
    """The fewest tokens that spell one shortest output, found from the start state: the
    whole (unrolled) table's exact minimum, not the bytes (the tree's: 14 tokens of this
    vocabulary, where `{"n":0,"kids":[]}` is 17 bytes)."""
    from gclm.compiler.whole.compile import compile_constraint

    whole = compile_constraint(Constraint.json_schema(SCHEMAS[name]), VOCAB)
    assert table(name).request_minimum() == whole.min_tokens
