"""Random object schemas with oneOf, not, dependentSchemas, if/then/else and allOf: every
object over three names that gclm's regex accepts is valid (checked with jsonschema).

The schemas mix required names, const/enum/type property checks and nesting, the shapes
the proofs and narrowings of oneOf, not, dependentSchemas and if/then/else read.
"""

from __future__ import annotations

import itertools
import json
import re

import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex
from gclm.errors import CompileLimitError, ConstraintError, UnsupportedSchemaError

NAMES = ("a", "b", "c")
VALUES = ("x", "y", 1)
INSTANCES = [
    dict(zip(names, values, strict=True))
    for k in range(len(NAMES) + 2)
    for names in itertools.combinations((*NAMES, "d"), k)
    for values in itertools.product(VALUES, repeat=k)
]

checks = st.sampled_from(
    [{"enum": ["x", "y"]}, {"type": "string"}, {"const": "x"}, {"const": "y"}, {"type": "integer"}]
)
names = st.lists(st.sampled_from(NAMES), min_size=1, max_size=2, unique=True)
leaves = st.fixed_dictionaries(
    {},
    optional={
        "required": names,
        "properties": st.dictionaries(st.sampled_from(NAMES), checks, max_size=2),
    },
)
subschemas = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.builds(lambda xs: {"anyOf": xs}, st.lists(inner, min_size=2, max_size=2)),
        st.builds(lambda x: {"not": x}, inner),
    ),
    max_leaves=3,
)
combinators = st.one_of(
    st.builds(lambda xs: {"oneOf": xs}, st.lists(subschemas, min_size=2, max_size=3)),
    st.builds(lambda x: {"not": x}, subschemas),
    st.builds(
        lambda d: {"dependentSchemas": d},
        st.dictionaries(st.sampled_from(NAMES), subschemas, min_size=1, max_size=2),
    ),
    st.builds(lambda i, t, e: {"if": i, "then": t, "else": e}, subschemas, subschemas, subschemas),
    st.builds(
        lambda xs, x: {"allOf": [{"oneOf": xs}, x]},
        st.lists(subschemas, min_size=2, max_size=2),
        subschemas,
    ),
)
objects = st.builds(
    lambda props, required, extra, more: {
        "type": "object",
        "properties": props,
        "required": required,
        **extra,
        **more,
    },
    st.fixed_dictionaries({n: checks for n in NAMES}),
    st.lists(st.sampled_from(NAMES), max_size=1),
    st.sampled_from([{}, {"additionalProperties": False}, {"additionalProperties": True}]),
    combinators,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(objects, st.sampled_from(["declared", "spec"]))
def test_every_accepted_object_is_valid(schema, additional_properties):
    try:
        regex = to_regex(
            Constraint.json_schema(schema, additional_properties=additional_properties)
        ).regex
    except (UnsupportedSchemaError, ConstraintError, CompileLimitError):
        return  # refused or empty: nothing generated
    validator = jsonschema.Draft202012Validator(schema)
    accepted = re.compile(regex)
    for value in INSTANCES:
        if accepted.fullmatch(json.dumps(value, separators=(",", ":"))):
            assert validator.is_valid(value), (schema, value)
