"""normalize_schema: each rewrite, each refusal (keyword and pointer), and what gets through."""

from __future__ import annotations

import json
import re

import pytest

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.json_schema.normalize import SchemaLimits, normalize_schema
from gclm.compiler.front.regex import to_regex
from gclm.errors import ConstraintError, UnsupportedSchemaError

ANY_1 = {
    "anyOf": [
        {"type": "null"},
        {"type": "boolean"},
        {"type": "number"},
        {"type": "string"},
        {
            "type": "array",
            "items": {"anyOf": [{"type": t} for t in ("null", "boolean", "number", "string")]},
        },
        {
            "type": "object",
            "additionalProperties": {
                "anyOf": [{"type": t} for t in ("null", "boolean", "number", "string")]
            },
        },
    ]
}


def matcher(schema):
    """fullmatch over compact JSON of an instance (the regex also allows `[ ]?` spaces)."""
    regex = re.compile(to_regex(Constraint.json_schema(schema)).regex)
    return lambda value: (
        regex.fullmatch(json.dumps(value, separators=(",", ":"), ensure_ascii=False)) is not None
    )


def refused(schema) -> UnsupportedSchemaError:
    with pytest.raises(UnsupportedSchemaError) as e:
        normalize_schema(schema)
    return e.value


# -------------------------------------------------------------------------- rewrites


def test_unknown_format_is_dropped_and_reported():
    schema = {"type": "object", "properties": {"date": {"type": "string", "format": "datetime"}}}
    node, rewrites = normalize_schema(schema)
    assert node == {"type": "object", "properties": {"date": {"type": "string"}}, "required": []}
    assert rewrites == [
        "/properties/date/format: unknown format 'datetime' treated as a plain string "
        "(an annotation: validators do not check it)"
    ]


@pytest.mark.parametrize("fmt", ["idn-hostname", "uri-template"])
def test_checked_format_gclm_cannot_enforce_is_refused(fmt):
    e = refused({"type": "object", "properties": {"x": {"type": "string", "format": fmt}}})
    assert e.keyword == "format"
    assert "/properties/x" in e.message and repr(fmt) in e.message


def test_iri_is_enforced():
    accepts = matcher({"type": "string", "format": "iri"})
    assert accepts("https://example.com/a?b=c")
    assert not accepts("not an iri")


@pytest.mark.parametrize(
    ("schema", "bounded"),
    [
        ({"type": "string"}, False),
        ({"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}, False),
        ({"type": "string", "maxLength": 2}, True),
    ],
)
def test_json_string_escapes(schema, bounded):
    regex = re.compile(to_regex(Constraint.json_schema(schema)).regex)

    def text(s):
        return json.dumps({"s": s} if schema["type"] == "object" else s, separators=(",", ":"))

    assert regex.fullmatch(text("\x85").replace("\\u0085", "\x85"))  # raw U+0085
    assert regex.fullmatch(text("\n\\"))  # short escapes
    assert not regex.fullmatch(text("\x01").replace("\\u0001", "\x01"))  # raw control
    assert not regex.fullmatch(text("\ud800"))  # a lone surrogate
    # `\uXXXX` in free text; a counted string keeps to the short escapes (fewer states).
    assert bool(regex.fullmatch(text("é").replace("\\u00e9", "\\u00E9"))) is not bounded
    assert bool(regex.fullmatch(text("\x01"))) is not bounded  # `\u0001`


def test_pattern_characters_may_be_raw_u007f_to_u009f():
    accepts = matcher({"type": "string", "pattern": "^.$"})
    assert accepts("\x85") and accepts("é")
    assert not accepts("\n")  # `.` excludes line terminators


def test_known_format_is_enforced():
    accepts = matcher({"type": "string", "format": "date"})
    assert accepts("2024-02-28")
    assert not accepts("2024-02-30")
    assert not accepts("yesterday")


@pytest.mark.parametrize("sub", [{}, {"default": None}, {"description": "anything"}, True])
def test_untyped_subschema_becomes_bounded_any_value(sub):
    node, rewrites = normalize_schema(
        {"type": "object", "properties": {"x": sub}, "required": ["x"]}
    )
    assert node["properties"]["x"] == ANY_1
    assert rewrites == [
        "/properties/x: accepts any JSON value; generating values nested at most 1 deep"
    ]
    accepts = matcher({"type": "object", "properties": {"x": sub}, "required": ["x"]})
    assert accepts({"x": [1, "a"]}) and accepts({"x": {"k": None}})
    assert not accepts({"x": [[1]]})


def test_annotations_are_dropped_silently():
    schema = {
        "type": "string",
        "title": "T",
        "description": "d",
        "default": "x",
        "examples": ["y"],
        "$comment": "c",
        "deprecated": True,
        "readOnly": True,
        "contentMediaType": "text/plain",
    }
    assert normalize_schema(schema) == ({"type": "string"}, [])


def test_unknown_keyword_is_reported():
    assert normalize_schema({"type": "string", "maxlength": 3})[1] == [
        "/maxlength: unknown keyword 'maxlength' ignored"
    ]


def test_type_and_enum_intersect():
    assert normalize_schema({"type": "string", "enum": ["a", 1, "b"]})[0] == {"enum": ["a", "b"]}


def test_allof_objects_merge_properties_and_required():
    schema = {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"properties": {"b": {"type": "string"}}, "required": ["b"]},
        ]
    }
    node, _ = normalize_schema(schema)
    assert node == {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
        "required": ["a", "b"],
    }


def test_allof_respects_a_closed_object():
    schema = {
        "allOf": [
            {
                "type": "object",
                "properties": {"a": {"type": "integer"}},
                "additionalProperties": False,
            },
            {"properties": {"b": {"type": "string"}}},
        ]
    }
    assert normalize_schema(schema)[0]["properties"] == {"a": {"type": "integer"}}


def test_no_value_satisfies():
    with pytest.raises(ConstraintError, match="No JSON value satisfies"):
        normalize_schema({"allOf": [{"type": "string"}, {"type": "integer"}]})


def test_missing_type_is_inferred_from_keywords():
    node, rewrites = normalize_schema({"properties": {"a": {"type": "integer"}}})
    assert node["type"] == "object"
    assert rewrites == ["/: no 'type'; generating only object values (its keywords' types)"]


def test_required_but_undeclared_property_is_generated():
    accepts = matcher(
        {"type": "object", "required": ["id"], "additionalProperties": {"type": "integer"}}
    )
    assert accepts({"id": 3})
    assert not accepts({})
    with pytest.raises(ConstraintError, match="No JSON value"):
        normalize_schema({"type": "object", "required": ["id"], "additionalProperties": False})


def test_pattern_properties_narrow_free_values():
    node, _ = normalize_schema(
        {
            "type": "object",
            "patternProperties": {"^x": {"type": "integer"}},
            "additionalProperties": {"type": "number"},
        }
    )
    assert node == {"type": "object", "additionalProperties": {"type": "integer"}}


def test_min_and_max_properties_on_declared_properties():
    # Five optional properties: more choices than are written out (test_counted_properties.py).
    props = {k: {"type": "integer"} for k in "abcde"}
    node, rewrites = normalize_schema({"type": "object", "properties": props, "minProperties": 1})
    assert node["required"] == ["a"]
    assert rewrites == ["/: minProperties 1: ['a'] made required"]
    node, rewrites = normalize_schema({"type": "object", "properties": props, "maxProperties": 2})
    assert list(node["properties"]) == ["a", "b"]


def test_dependent_required_makes_dependents_required():
    schema = {
        "type": "object",
        "properties": {"card": {"type": "string"}, "zip": {"type": "string"}},
        "dependentRequired": {"card": ["zip"]},
    }
    node, rewrites = normalize_schema(schema)
    assert node["required"] == ["zip"]
    assert rewrites == ["/dependentRequired/card: ['zip'] made required (they depend on 'card')"]


def test_draft4_boolean_exclusive_minimum():
    accepts = matcher({"type": "integer", "minimum": 0, "exclusiveMinimum": True})
    assert accepts(1) and not accepts(0)


def test_numeric_bounds_are_enforced():
    accepts = matcher(
        {
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": 0}},
            "required": ["n"],
        }
    )
    assert accepts({"n": 5}) and not accepts({"n": -5})
    accepts = matcher({"type": "number", "minimum": 0, "maximum": 1})
    assert accepts(0.5) and accepts(1) and not accepts(1.5)
    accepts = matcher({"type": "number", "multipleOf": 0.01})
    assert accepts(1.25) and not accepts(1.255)


def test_prefix_items_tuple_and_max_items():
    node, rewrites = normalize_schema(
        {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "maxItems": 1}
    )
    assert node == {"type": "array", "prefixItems": [{"type": "integer"}]}
    assert rewrites == ["/: arrays generated with exactly 1 items"]


def test_items_false_allows_only_the_empty_array():
    assert normalize_schema({"type": "array", "items": False})[0] == {
        "type": "array",
        "maxItems": 0,
    }


def test_refs_resolve_in_defs_definitions_and_anchors():
    schema = {
        "type": "array",
        "items": [{"$ref": "#/$defs/a"}, {"$ref": "#/definitions/b"}, {"$ref": "#c"}],
        "$defs": {"a": {"type": "integer"}},
        "definitions": {"b": {"type": "string"}},
        "properties": {},
        "x": {"$anchor": "c", "type": "null"},
    }
    node, _ = normalize_schema(schema)
    assert node["prefixItems"] == [{"type": "integer"}, {"type": "string"}, {"type": "null"}]


def test_recursive_ref_is_cut_and_reported():
    schema = {
        "$ref": "#/$defs/node",
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"next": {"$ref": "#/$defs/node"}},
                "required": [],
            }
        },
    }
    node, rewrites = normalize_schema(schema, SchemaLimits(max_recursion=2))
    assert node["properties"]["next"]["properties"] == {}
    assert rewrites == [
        "/$defs/node/properties/next: recursive $ref '#/$defs/node' cut after 2 levels; "
        "deeper values are not generated"
    ]


def test_oneof_with_exclusive_branches_becomes_anyof():
    schema = {
        "oneOf": [
            {
                "type": "object",
                "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}},
                "required": ["kind"],
            },
            {"type": "object", "properties": {"kind": {"const": "b"}}, "required": ["kind"]},
        ]
    }
    node, rewrites = normalize_schema(schema)
    assert len(node["anyOf"]) == 2 and rewrites == []


def test_not_filters_enum_values():
    assert normalize_schema({"allOf": [{"enum": [{}, 1]}, {"not": {"type": "integer"}}]})[0] == {
        "enum": [{}]
    }


# ---------------------------------------------------------------------------- patterns


def test_anchored_pattern_is_the_whole_string():
    accepts = matcher({"type": "string", "pattern": "^[A-Z]{2}[0-9]+$"})
    assert accepts("AB12") and not accepts("xAB12")


def test_unanchored_pattern_means_contains():
    accepts = matcher({"type": "string", "pattern": "ab"})
    assert accepts("xaby") and accepts("ab") and not accepts("a-b")
    starts = matcher({"type": "string", "pattern": "^ab"})
    assert starts("abx") and not starts("xab")


def test_pattern_text_is_json_escaped():
    schema = {"type": "array", "items": {"type": "string", "pattern": "^.*$"}}
    accepts = re.compile(to_regex(Constraint.json_schema(schema)).regex)
    assert accepts.fullmatch('["a\\"b"]')
    assert not accepts.fullmatch('["a"b"]')
    assert not accepts.fullmatch('["a\nb"]')


def test_top_level_string_has_no_quotes():
    result = to_regex(Constraint.json_schema({"type": "string", "maxLength": 40}))
    assert re.fullmatch(result.regex, '"it\'s \\n fine"')
    assert not re.fullmatch(result.regex, '"say \\"hi\\""')
    assert "without '\"'" in result.rewrites[-1]


def test_pattern_and_length_fold_together():
    accepts = matcher({"type": "string", "pattern": "^[a-z][a-z0-9]*$", "maxLength": 3})
    assert accepts("ab1") and not accepts("ab12")


def test_unanchored_pattern_with_lengths_narrows_its_padding():
    accepts = matcher({"type": "string", "pattern": "[0-9]{10}", "minLength": 10, "maxLength": 10})
    assert accepts("0123456789")
    assert not accepts("a0123456789") and not accepts("01234567890")
    accepts = matcher({"type": "string", "pattern": "(a|b)+c", "maxLength": 4})
    assert accepts("abc") and accepts("bc")  # counts are shared out: a subset of the rest
    assert not accepts("ababc") and not accepts("c")


@pytest.mark.parametrize(
    ("pattern", "inside", "too_long"),
    [
        (
            "^data:image/(jpg|png|svg\\+xml);base64,[0-9a-zA-Z+/=]*$",
            "data:image/png;base64,AA",
            None,
        ),
        ("^(\\d+\\.\\d+\\.\\d+.*)$", "1.2.3", "1.2.3-beta.45678"),
        ("^[a-z]+:[a-z0-9]+$", "ab:c1", "abcdefghijklmnop:q"),
    ],
)
def test_several_repeats_share_the_max_length(pattern, inside, too_long):
    accepts = matcher({"type": "string", "pattern": pattern, "minLength": 3, "maxLength": 30})
    assert accepts(inside)
    assert not accepts("-" + inside)
    assert not accepts(inside + "=" * 24)
    if too_long:
        assert not accepts(too_long + "x" * 14)


def test_min_length_raises_repeat_counts():
    accepts = matcher({"type": "string", "pattern": "^[a-z]+-[0-9]+$", "minLength": 6})
    assert accepts("abcd-1") or accepts("a-12345")
    assert not accepts("ab-1")


def test_anchors_inside_an_alternation_or_a_group():
    accepts = matcher({"type": "string", "pattern": "^$|(^[0-9]{3}$)"})
    assert accepts("") and accepts("123")
    assert not accepts("12") and not accepts("x123")
    accepts = matcher({"type": "string", "pattern": "^ab$|^cd$"})
    assert accepts("ab") and accepts("cd") and not accepts("abcd")


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("schema", "keyword", "pointer"),
    [
        (
            {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "minItems": 2},
            "uniqueItems",
            "/",
        ),
        (
            {
                "type": "object",
                "properties": {
                    "t": {"type": "array", "contains": {"type": "integer"}, "maxContains": 1}
                },
            },
            "contains",
            "/properties/t",
        ),
        ({"type": "string", "if": {"pattern": "^a"}, "then": False}, "if", "/"),
        ({"type": "string", "not": {"pattern": "a"}}, "not", "/"),
        ({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]}, "oneOf", "/"),
        ({"type": "integer", "multipleOf": 3}, "multipleOf", "/"),
        ({"type": "string", "pattern": "^(?=a)b$"}, "pattern", "/"),
        (
            {"type": "string", "pattern": "^(ab|c)+$", "minLength": 3, "maxLength": 3},
            "pattern",
            "/",
        ),
        ({"type": "object", "propertyNames": {"maxLength": 3}}, "propertyNames", "/"),
        (
            {  # five optional triggers: 32 objects, past MAX_OPTIONAL_TRIGGERS
                "type": "object",
                "properties": {n: {} for n in "abcdef"},
                "dependentSchemas": {n: {"required": ["f"]} for n in "abcde"},
            },
            "dependentSchemas",
            "/",
        ),
        ({"$ref": "other.json#/x"}, "$ref", "/"),
        ({"$dynamicRef": "#meta"}, "$dynamicRef", "/"),
    ],
)
def test_unsupported_keyword_names_keyword_and_pointer(schema, keyword, pointer):
    error = refused(schema)
    assert (error.keyword, error.pointer) == (keyword, pointer)
    assert f"{keyword!r} at {pointer}" in error.message


@pytest.mark.parametrize(
    ("pattern", "min_len", "max_len"),
    [("a+:[0-9]*", 2, 4), ("^(a|1)+-?$", 3, 5), ("^$|(^a+1*$)", 1, 3), ("1", 0, 2)],
)
def test_folded_lengths_never_accept_an_invalid_string(pattern, min_len, max_len):
    import itertools

    schema = {"type": "string", "pattern": pattern, "minLength": min_len, "maxLength": max_len}
    accepts = matcher(schema)
    accepted = 0
    for n in range(7):
        for chars in itertools.product("a1:-", repeat=n):
            value = "".join(chars)
            if accepts(value):
                accepted += 1
                assert min_len <= len(value) <= max_len and re.search(pattern, value), value
    assert accepted
