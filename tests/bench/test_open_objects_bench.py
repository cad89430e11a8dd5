"""bench/open_objects.py's judges and bench/minimize.py's two compiles, on hand-made input."""

from __future__ import annotations

from bench.minimize import compile_once
from bench.open_objects import differs, other_keys
from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex
from gclm.compiler.vocab.vocabulary import TokenVocabulary

SCHEMA = {
    "type": "object",
    "properties": {
        "a": {"type": "object", "properties": {"b": {}}},
        "c": {"items": {"$ref": "#/$defs/item"}},
        "d": {"type": "object"},  # free keys: none is another key
    },
    "required": ["a", "e"],  # a required name that is not declared is not another key
    "$defs": {"item": {"properties": {"x": {}}, "additionalProperties": True}},
}


def test_other_keys_follow_properties_items_and_refs():
    value = {"a": {"b": 1, "z": 2}, "c": [{"x": 1, "y": 2}], "d": {"k": 1}, "e": 0, "f": 1}
    assert other_keys(value, SCHEMA, SCHEMA) == 2  # "f" at the top, "z" inside "a"
    assert other_keys({"a": {"b": 1}}, SCHEMA, SCHEMA) == 0


def test_differs_where_an_object_leaves_additional_properties_unsaid():
    assert differs(SCHEMA)
    assert not differs({"properties": {"a": {}}, "additionalProperties": False})
    assert not differs({"type": "object"})


def test_both_compiles_give_the_same_minimum():
    vocab = TokenVocabulary((b"a", b"b", b"ab", b"c", None), 4, "plain")
    regex = to_regex(Constraint.regex("(?:ab|cb)(?:a|b)")).regex
    minimal, as_built = compile_once(regex, vocab, True), compile_once(regex, vocab, False)
    assert minimal["min_tokens"] == as_built["min_tokens"] == 2
