"""Objects and arrays in an `enum` or `const` match exactly themselves (outlines-core writes
their keys raw into its regex; compiler/front/json_schema/regex.py writes them itself)."""

from __future__ import annotations

import re

import pytest

from gclm.compiler.front.json_schema import normalize_schema, schema_regex

SPECIAL = {"a.b": 1, "c(": ["x\u0006", None], "[é]": {"d|e": True}}


def regex_of(schema: dict) -> str:
    normalized, _ = normalize_schema(schema)
    return schema_regex(normalized, "")


@pytest.mark.parametrize("schema", [{"enum": [SPECIAL, "q"]}, {"const": SPECIAL}])
def test_special_keys_match_only_themselves(schema: dict) -> None:
    regex = regex_of(schema)
    re.compile(regex)  # balanced: "c(" no longer opens a group
    assert re.fullmatch(regex, '{"a.b":1,"c(":["x\\u0006",null],"[é]":{"d|e":true}}')
    assert not re.fullmatch(regex, '{"aXb":1,"c(":["x\\u0006",null],"[é]":{"d|e":true}}')
    assert not re.fullmatch(regex, '{"a.b":1,"c(":["x\\u0006",null],"[é]":{"e":true}}')


def test_scalar_enums_are_outlines_cores_as_before() -> None:
    regex = regex_of({"enum": ["a.b", 2, None]})
    assert re.fullmatch(regex, '"a.b"') and not re.fullmatch(regex, '"aXb"')
    assert re.fullmatch(regex, "2") and re.fullmatch(regex, "null")


def test_an_object_in_an_enum_inside_an_object() -> None:
    regex = regex_of(
        {"type": "object", "properties": {"k": {"const": {"x(": 1}}}, "required": ["k"]}
    )
    assert re.fullmatch(regex, '{"k":{"x(":1}}')
    assert not re.fullmatch(regex, '{"k":{"x":1}}')
