"""The prover's verdict on a concrete value (`Prover.holds`) for the object and array keywords
it reads: whenever it answers True or False, jsonschema agrees; and the narrowing it feeds
(an enum under `not`)."""

from __future__ import annotations

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gclm.compiler.front.json_schema.normalize import normalize_schema
from gclm.compiler.front.json_schema.proofs import Prover

NAMES = ("a", "ab", "b", "0")
scalars = st.one_of(
    st.sampled_from(["x", "y", 1, 1.0, 2, 2.5, True, None]),
    st.integers(-3, 3),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(NAMES), inner, max_size=3),
    ),
    max_leaves=6,
)
leaf_checks = st.sampled_from(
    [
        {"type": "string"},
        {"type": "integer"},
        {"const": 1},
        {"enum": ["x", 2]},
        {"type": "array", "uniqueItems": True},
        {"type": "string", "pattern": "^a"},
    ]
)
checks = st.recursive(
    leaf_checks,
    lambda inner: st.one_of(
        st.builds(lambda x: {"not": x}, inner),
        st.fixed_dictionaries(
            {},
            optional={
                "patternProperties": st.dictionaries(st.sampled_from(["^a", "b$", "0"]), inner),
                "propertyNames": st.sampled_from([{"pattern": "^a"}, {"maxLength": 1}]),
                "additionalProperties": inner,
                "properties": st.dictionaries(st.sampled_from(NAMES), inner, max_size=2),
                "dependentRequired": st.dictionaries(
                    st.sampled_from(NAMES), st.lists(st.sampled_from(NAMES), max_size=2)
                ),
                "uniqueItems": st.booleans(),
                "contains": inner,
                "items": inner,
            },
        ),
    ),
    max_leaves=4,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(checks, values)
def test_a_verdict_is_jsonschemas(schema: dict, value: object) -> None:
    verdict = Prover(lambda ref: pytest.fail(f"no $ref here: {ref}")).holds(schema, value)
    if verdict is not None:
        assert verdict == jsonschema.Draft202012Validator(schema).is_valid(value), (schema, value)


@pytest.mark.parametrize(
    ("schema", "value", "verdict"),
    [
        ({"patternProperties": {"^a": {"type": "integer"}}}, {"ab": "x"}, False),
        ({"patternProperties": {"^a": {"type": "integer"}}}, {"ab": 1, "b": "x"}, True),
        ({"propertyNames": {"maxLength": 1}}, {"ab": 1}, False),
        ({"uniqueItems": True}, [1, 1.0], False),
        ({"uniqueItems": True}, [[1], [1.0]], False),
        ({"uniqueItems": True}, [1, True], True),
        ({"contains": {"const": 2}}, [1, 3], False),
        ({"contains": {"const": 2}}, [1, 2], True),
        ({"dependentRequired": {"a": ["b"]}}, {"a": 1}, False),
    ],
)
def test_verdicts(schema: dict, value: object, verdict: bool) -> None:
    assert Prover(lambda ref: {}).holds(schema, value) is verdict
    assert jsonschema.Draft202012Validator(schema).is_valid(value) is verdict


def test_an_enum_under_not_keeps_the_values_proven_to_fail_it() -> None:
    """MaskBench's draft2019_09 patternProperties `not` case: the enum's one value fails the
    `not` subschema through a pattern property, so it is kept, and nothing else."""
    schema = {
        "allOf": [
            {"enum": [{"aaa": "foo", "aaaa": 31}, {"aaaa": 1}]},
            {"not": {"patternProperties": {"a*": {"type": "integer"}, "aaa*": {"maximum": 20}}}},
        ]
    }
    node, _ = normalize_schema(schema)
    assert node == {"enum": [{"aaa": "foo", "aaaa": 31}]}
