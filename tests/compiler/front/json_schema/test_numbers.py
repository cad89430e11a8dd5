"""Bounded-number regexes against Decimal arithmetic, on hand-picked and generated values."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.json_schema.numbers import nonneg_int_range, number_regex
from gclm.compiler.front.regex import to_regex
from gclm.errors import ConstraintError, UnsupportedSchemaError


def valid(node: dict, text: str) -> bool:
    x = Decimal(text)
    if node["type"] == "integer" and x != x.to_integral_value():
        return False
    checks = {
        "minimum": lambda b: x >= b,
        "maximum": lambda b: x <= b,
        "exclusiveMinimum": lambda b: x > b,
        "exclusiveMaximum": lambda b: x < b,
        "multipleOf": lambda b: x % b == 0,
    }
    return all(check(Decimal(str(node[k]))) for k, check in checks.items() if k in node)


NODES = [
    {"type": "integer", "minimum": 0},
    {"type": "integer", "minimum": 1, "maximum": 65535},
    {"type": "integer", "minimum": -360, "maximum": 360},
    {"type": "integer", "exclusiveMinimum": 0.5, "maximum": 100.5},
    {"type": "integer", "multipleOf": 5},
    {"type": "integer", "multipleOf": 7, "minimum": 0, "maximum": 100},
    {"type": "number", "minimum": 0},
    {"type": "number", "minimum": 0, "maximum": 1},
    {"type": "number", "minimum": 0.2},
    {"type": "number", "exclusiveMinimum": 0},
    {"type": "number", "minimum": -180.5, "exclusiveMaximum": 180.25},
    {"type": "number", "minimum": 0, "maximum": 0.5},
    {"type": "number", "maximum": 0},
    {"type": "number", "multipleOf": 0.01},
    # Bounded multiples the digit rules do not express, listed.
    {"type": "number", "multipleOf": 0.5, "minimum": 0, "maximum": 5},
    {"type": "number", "multipleOf": 2.5, "exclusiveMinimum": -10, "exclusiveMaximum": 10},
    {"type": "number", "multipleOf": 0.25, "minimum": -1.3, "maximum": 2.1},
    {"type": "number", "multipleOf": 0.01, "minimum": 0.5, "maximum": 0.75},
    {"type": "integer", "multipleOf": 2.5, "minimum": 0, "maximum": 40},
    # A divisor of 10,000 with any bounds: the leading digits against the bounds', the last
    # ones from the multiples below a power of ten.
    {"type": "integer", "multipleOf": 5, "minimum": 10},
    {"type": "integer", "multipleOf": 25, "minimum": 1250},
    {"type": "integer", "multipleOf": 8, "minimum": -3000, "maximum": 123456},
    {"type": "integer", "multipleOf": 16, "minimum": 100},
    {"type": "integer", "multipleOf": 50, "maximum": -20},
    {"type": "integer", "multipleOf": 4, "exclusiveMinimum": 1003, "exclusiveMaximum": 99999},
    {"type": "number", "multipleOf": 10, "minimum": 15},
]

# Plain decimals without redundant spellings (no leading zeros, no trailing fraction zeros):
# every number in range has exactly one such spelling, and the regex must accept it.
DECIMALS = st.builds(
    lambda sign, whole, frac: f"{sign}{whole}" + (f".{frac}" if frac else ""),
    st.sampled_from(["", "-"]),
    st.one_of(st.integers(0, 20), st.integers(0, 100_000)),
    st.one_of(st.just(""), st.from_regex(r"[0-9]{0,3}[1-9]", fullmatch=True)),
).filter(lambda t: t not in ("-0",))


@pytest.mark.parametrize("node", NODES, ids=lambda n: str(n))
@settings(max_examples=60, deadline=None)
@given(text=DECIMALS)
def test_regex_accepts_exactly_the_valid_spellings(node, text):
    assert (re.fullmatch(number_regex(node, ""), text) is not None) == valid(node, text)


def test_edges():
    r = number_regex({"type": "number", "exclusiveMinimum": 0, "maximum": 1}, "")
    assert [t for t in ("0", "0.0", "0.001", "1", "1.5", "-0.5") if re.fullmatch(r, t)] == [
        "0.001",
        "1",
    ]


def test_integer_ranges_split_by_length():
    assert nonneg_int_range(5, 12) == "(?:[5-9]|1[0-2])"
    assert nonneg_int_range(0, None) == "(?:[0-9]|[1-9][0-9]{1,})"
    assert nonneg_int_range(3, 2) is None


def test_no_bounds_means_outlines_core_handles_it():
    assert number_regex({"type": "number"}, "") is None


@pytest.mark.parametrize(
    "node",
    [
        {"type": "number", "multipleOf": 2.5},  # unbounded
        {"type": "number", "multipleOf": 0.3, "minimum": 0, "maximum": 1000},  # 3,334 values
        {"type": "integer", "multipleOf": 3, "minimum": 10},  # 3 divides no power of ten
    ],
)
def test_unsupported_multiple_of_names_the_pointer(node):
    with pytest.raises(UnsupportedSchemaError) as e:
        number_regex(node, "/properties/x")
    assert (e.value.keyword, e.value.pointer) == ("multipleOf", "/properties/x")


def test_bounded_multiples_are_listed_plainly():
    r = number_regex({"type": "number", "multipleOf": 0.5, "minimum": -1, "maximum": 1}, "")
    assert r == r"(?:-1|-0\.5|0|0\.5|1)"


@pytest.mark.parametrize(
    "node",
    [
        {"type": "integer", "minimum": 5, "maximum": 3},
        {"type": "integer", "minimum": 0.2, "maximum": 0.8},  # no integer between
        {"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 4},
        {"type": "number", "minimum": 2.5, "maximum": 1},
        {"type": "number", "exclusiveMinimum": 1, "maximum": 1},
    ],
)
def test_empty_range_is_a_clear_constraint_error(node: dict) -> None:
    # The probe: minimum above maximum gave outlines-core's text about an "encoding issue".
    with pytest.raises(ConstraintError, match="lower bound is above the upper one") as caught:
        to_regex(Constraint.json_schema({"type": "object", "properties": {"n": node}}))
    assert "/properties/n" in caught.value.message
    assert "encoding" not in caught.value.message


@pytest.mark.parametrize("step", [2, 8, 16, 25, 625, 1000, 2000])
@pytest.mark.parametrize(
    "bounds",
    [{"minimum": 10}, {"minimum": 1250}, {"minimum": -3000, "maximum": 123456},
     {"maximum": -20}, {"minimum": 999, "maximum": 5001}, {"minimum": -7777}, {}],
)  # fmt: skip
def test_multiples_of_a_divisor_of_10000_within_any_bounds(step, bounds):
    """Every integer from -8,000 to 8,000 and around 123,456 (the bounds' thousands and
    those beside them): the regex accepts exactly the multiples within the bounds."""
    node = {"type": "integer", "multipleOf": step, **bounds}
    regex = re.compile(number_regex(node, ""))
    lo, hi = bounds.get("minimum", -(10**9)), bounds.get("maximum", 10**9)
    for x in [*range(-8_000, 8_000), *range(121_000, 125_000)]:
        assert (regex.fullmatch(str(x)) is not None) == (lo <= x <= hi and x % step == 0), x
