"""An explicit additionalProperties beside declared properties: extra keys before, between
and after them."""

from __future__ import annotations

import json
import re

import jsonschema
from hypothesis import given, settings
from hypothesis import strategies as st
from json_accepts import accepts, accepts_text

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.json_schema.finish import MAX_EXTRAS_ANYWHERE
from gclm.compiler.front.json_schema.open_objects import other_key_regex
from gclm.compiler.front.regex import to_regex
from gclm.compiler.whole.byte_dfa import byte_dfa

# MaskBench Snowplow---sp_180: a newsletter object that allows other keys.
NEWSLETTER = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "send_id": {"type": "string"}},
    "additionalProperties": True,
}


def test_extra_keys_go_anywhere_among_the_declared_ones():
    assert accepts(NEWSLETTER, {"id": "a", "send_id": "b", "extra": "c", "more": [1, None]})
    assert accepts(NEWSLETTER, {"extra": 1})
    assert accepts(NEWSLETTER, {"send_id": "b", "x": {"y": 2}})
    assert accepts(NEWSLETTER, {})
    assert accepts(NEWSLETTER, {"x": 1, "id": "a", "y": 2, "send_id": "b", "z": 3})
    assert accepts(NEWSLETTER, {"x": 1, "y": 2, "send_id": "b"})
    assert not accepts_text(NEWSLETTER, '{,"x":1}')
    assert not accepts_text(NEWSLETTER, '{"x":1,}')
    assert not accepts_text(NEWSLETTER, '{"x":1"id":"a"}')
    assert not accepts_text(NEWSLETTER, '{"x":1,,"id":"a"}')
    # The declared ones keep their order.
    assert not accepts(NEWSLETTER, {"send_id": "b", "x": 1, "id": "a"})


PROPERTIES = {"a": {"type": "integer"}, "bb": {"type": "string"}, "c": {"type": "boolean"}}
VALUES = {"a": 1, "bb": "t", "c": True}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(list(PROPERTIES)), unique=True).map(sorted),
    st.lists(st.sampled_from(list(PROPERTIES)), unique=True),
    st.lists(
        st.tuples(
            st.integers(0, 3),
            st.text(alphabet="abcx", max_size=3),
            st.sampled_from([0, "s", None, [1], {"k": False}]),
        ),
        max_size=4,
    ),
)
def test_open_objects_accept_exactly_what_the_specification_allows(present, required, extras):
    """Declared properties in order (some left out), other keys inserted anywhere: accepted
    exactly when a validator says the object is valid and the declared names come once
    each, in order (an inserted key may happen to be a declared name)."""
    schema = {"type": "object", "properties": PROPERTIES, "required": required}
    items = [(n, VALUES[n]) for n in present]
    for place, name, value in extras:
        items.insert(min(place, len(items)), (name, value))
    text = "{" + ",".join(f"{json.dumps(n)}:{json.dumps(v)}" for n, v in items) + "}"
    # Declared names once each, in declared order (the order gclm writes); other keys may
    # repeat each other (a parser keeps the last, which the schema allows as the first).
    declared = [n for n, _ in items if n in PROPERTIES]
    in_order = declared == [n for n in PROPERTIES if n in declared]
    valid = in_order and jsonschema.Draft202012Validator(schema).is_valid(dict(items))
    assert accepts_text(schema, text, additional_properties="spec") == valid


def test_an_extra_key_never_repeats_a_declared_one():
    assert not accepts_text(NEWSLETTER, '{"id":"a","id":1}')
    assert not accepts_text(NEWSLETTER, '{"id":"a","send_id":"b","send_id":2}')
    assert not accepts_text(NEWSLETTER, '{"id":"a","\\u0069d":1}')  # escapes: not in extra keys
    assert accepts_text(NEWSLETTER, '{"id":"a","i":1,"ids":2,"send":3}')


def test_required_and_schema_valued_extras():
    schema = {**NEWSLETTER, "required": ["send_id"], "additionalProperties": {"type": "integer"}}
    assert accepts(schema, {"id": "a", "send_id": "b", "n": 3})
    assert not accepts(schema, {"id": "a", "send_id": "b", "n": "3"})
    assert not accepts(schema, {"id": "a", "n": 3})


def test_without_additional_properties_only_declared_keys():
    schema = {k: v for k, v in NEWSLETTER.items() if k != "additionalProperties"}
    assert not accepts(schema, {"id": "a", "extra": "c"})
    assert not accepts({**NEWSLETTER, "maxProperties": 3}, {"id": "a", "extra": "c"})


def test_one_of_open_branches_is_generated_closed():
    def branch(name):
        return {**NEWSLETTER, "properties": {name: {"type": "string"}}, "required": [name]}

    schema = {"oneOf": [branch("a"), branch("b")]}
    assert accepts(schema, {"a": "x"}) and accepts(schema, {"b": "y"})
    assert not accepts(schema, {"a": "x", "b": "y"})  # matches both branches


NAMES = ["id", "i", "send_id", "", 'q"uote']


@given(st.text(alphabet='aidsen_q"\\\x01é', max_size=6))
def test_other_key_is_any_raw_string_but_the_names(name):
    text = json.dumps(name, ensure_ascii=False)
    raw = not any(c in '"\\' or ord(c) < 0x20 for c in name)
    assert (re.fullmatch(other_key_regex(NAMES), text) is not None) == (raw and name not in NAMES)


@given(st.text(alphabet="néa\u4e2d", max_size=4))
def test_other_key_with_non_ascii_names(name):
    names = ["né", "中a", "a"]
    text = json.dumps(name, ensure_ascii=False)
    assert (re.fullmatch(other_key_regex(names), text) is not None) == (name not in names)


def test_other_key_automaton_stays_small():
    # One loop of raw characters shared by every exit from the names' trie: a few states
    # per character of the names, not a copy of the UTF-8 string automaton each.
    names = ["enable", "password", "remote_url", "username"]
    states = byte_dfa(other_key_regex(names)).next.shape[0]
    assert states < 2 * sum(len(n) for n in names) + 20


def test_a_forbidden_declared_name_is_no_other_key():
    schema = {**NEWSLETTER, "properties": {**NEWSLETTER["properties"], "secret": False}}
    assert accepts(schema, {"id": "a"})
    assert accepts(schema, {"other": 1, "id": "a", "more": 2})
    assert not accepts(schema, {"id": "a", "secret": 1})
    assert not accepts(schema, {"secret": 1})
    both = {"allOf": [NEWSLETTER, {**NEWSLETTER, "properties": {"id": {"type": "integer"}}}]}
    assert not accepts(both, {"id": 1})  # no value fits "id" ...
    assert not accepts(both, {"send_id": "b", "id": 1})  # ... so no extra key may be it
    assert accepts(both, {"send_id": "b", "x": 1})
    # MaskBench Github_easy o31158: a declared enum of strings that says `type: object`.
    impossible = {"properties": {"builtin": {"enum": ["A"], "type": "object"}, "n": {}}}
    assert accepts(impossible, {"builtin ": "A", "n": 1}, additional_properties="spec")
    assert not accepts(impossible, {"builtin": "A"}, additional_properties="spec")


def test_dependencies_keep_the_object_closed():
    schema = {**NEWSLETTER, "dependentRequired": {"trigger": ["id"]}}
    assert not accepts(schema, {"send_id": "b", "trigger": 1})


def test_spec_mode_accepts_other_keys_where_none_are_said():
    schema = {k: v for k, v in NEWSLETTER.items() if k != "additionalProperties"}
    spec = {"additional_properties": "spec"}
    assert accepts(schema, {"id": "a", "extra": "c", "more": [1, None]}, **spec)
    assert accepts(schema, {"other": {"x": 1}}, **spec)
    assert not accepts_text(schema, '{"id":"a","id":1}', **spec)  # never a declared name
    closed = {**schema, "additionalProperties": False}
    assert not accepts(closed, {"id": "a", "extra": "c"}, **spec)  # said false: closed


def test_many_declared_properties_take_other_keys_after_them_only():
    """Past MAX_EXTRAS_ANYWHERE declared properties, other keys go after them (each place
    among them would cost its own copy of the other keys' automaton), and the rewrite says
    so."""
    props = {f"p{i}": {"type": "integer"} for i in range(MAX_EXTRAS_ANYWHERE + 1)}
    schema = {"type": "object", "properties": props, "additionalProperties": True}
    assert accepts(schema, {"p0": 1, "p5": 2, "x": 3, "y": [4]})
    assert accepts(schema, {"x": 3})
    assert accepts(schema, {})
    assert not accepts(schema, {"x": 3, "p0": 1})
    assert not accepts(schema, {"p0": 1, "x": 3, "p5": 2})
    assert not accepts_text(schema, '{"p0":1,"p0":2}')
    rewrites = to_regex(Constraint.json_schema(schema)).rewrites
    assert any("other keys only after the 17 declared properties" in r for r in rewrites)
    fewer = {**schema, "properties": dict(list(props.items())[:MAX_EXTRAS_ANYWHERE])}
    assert accepts(fewer, {"x": 3, "p0": 1})
    assert not to_regex(Constraint.json_schema(fewer)).rewrites
