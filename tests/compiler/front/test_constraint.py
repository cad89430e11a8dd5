"""The one constraint parser: response_format dicts, structured-outputs dicts, Constraints."""

from __future__ import annotations

import json

import pytest

from gclm.compiler.front.constraint import Constraint, parse_constraint
from gclm.errors import ConstraintError

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def test_parse_constraint_forms():
    schema_rf = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
    assert parse_constraint(schema_rf) == Constraint.json_schema(SCHEMA)
    assert parse_constraint({"json": SCHEMA}) == Constraint.json_schema(SCHEMA)
    assert parse_constraint({"json": json.dumps(SCHEMA)}) == Constraint.json_schema(SCHEMA)
    assert parse_constraint({"type": "json_object"}) == Constraint.json_object()
    assert parse_constraint({"regex": "[ab]+"}) == Constraint.regex("[ab]+")
    assert parse_constraint({"choice": ["yes", "no"]}) == Constraint.choice(["yes", "no"])
    c = Constraint.regex("x")
    assert parse_constraint(c) is c


@pytest.mark.parametrize(
    "bad",
    [
        "json",
        {"type": "text"},
        {"type": "json_schema", "json_schema": {"name": "x"}},
        {"regex": "a", "choice": ["a"]},
        {"grammar": "root ::= 'a'"},
    ],
)
def test_parse_constraint_rejects(bad):
    with pytest.raises(ConstraintError):
        parse_constraint(bad)


@pytest.mark.parametrize(
    ("bad", "param"),
    [
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "json_schema.schema"),
        ({"type": "json_schema", "json_schema": {"schema": 3}}, "json_schema.schema"),
        ({"type": "text"}, "type"),
        ({"regex": ""}, "regex"),
        ({"choice": []}, "choice"),
        ({"json": "{not json"}, "json"),
        ({"grammar": "x"}, "grammar"),
        ({"regex": "a", "choice": ["a"]}, None),
        ({}, None),
    ],
)
def test_parse_constraint_errors_name_the_key(bad, param):
    with pytest.raises(ConstraintError) as caught:
        parse_constraint(bad)
    assert caught.value.param == param


def test_parse_constraint_whitespace_applies_to_json_only():
    assert parse_constraint({"json": SCHEMA}, whitespace=" ?").whitespace == " ?"
    assert parse_constraint({"type": "json_object"}, whitespace=" ?").whitespace == " ?"
    assert parse_constraint({"regex": "a+"}, whitespace=" ?") == Constraint.regex("a+")


def test_additional_properties_is_the_json_schemas_option():
    default = parse_constraint({"json": SCHEMA})
    assert default.additional_properties == "declared"
    spec = parse_constraint({"json": SCHEMA}, additional_properties="spec")
    assert spec.additional_properties == "spec"
    assert spec.key_material() != default.key_material()  # two tables, two cache entries
    # The dict's own option decides over the caller's default.
    assert (
        parse_constraint(
            {"json": SCHEMA, "disable_additional_properties": True}, additional_properties="spec"
        )
        == default
    )
    assert parse_constraint({"json": SCHEMA, "disable_additional_properties": False}) == spec
    rf = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
    assert parse_constraint(rf, additional_properties="spec") == spec


@pytest.mark.parametrize(
    "bad",
    [
        {"regex": "a+", "disable_additional_properties": True},
        {"json": SCHEMA, "disable_additional_properties": "yes"},
    ],
)
def test_disable_additional_properties_errors_name_it(bad):
    with pytest.raises(ConstraintError) as caught:
        parse_constraint(bad)
    assert caught.value.param == "disable_additional_properties"


@pytest.mark.parametrize(
    "constraint",
    [
        Constraint.json_schema(SCHEMA),
        Constraint.json_schema(SCHEMA, additional_properties="spec"),
        Constraint.json_object(),
        Constraint.regex("[0-9]{2}"),
        Constraint.choice(["yes", "no"]),
        Constraint.grammar('start: "a" | "b"'),
    ],
)
def test_as_spec_reads_back_as_the_same_constraint(constraint):
    # What crosses to vLLM's engine core: every kind, the grammar one included.
    assert parse_constraint(json.loads(json.dumps(constraint.as_spec()))) == constraint
