"""Leaves are spliced into outlines-core's regex in one pass.

(compiler/front/json_schema/regex.py)
"""

from __future__ import annotations

import re

import pytest

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.json_schema.regex import _splice
from gclm.compiler.front.regex import to_regex
from gclm.errors import ConstraintError


def test_every_occurrence_is_replaced_and_leaves_are_not_read_again():
    leaves = {"p0x0": "a+", "p0x1": '"p0x0"', "p0x10": "b"}
    out = _splice('\\{"p0x0",("p0x1")*,"p0x10","p0x0"\\}', "p0x", leaves)
    # p0x1's leaf is another placeholder's quoted text: written as it is, not replaced.
    assert out == '\\{(?:a+),((?:"p0x0"))*,(?:b),(?:a+)\\}'


def test_a_placeholder_missing_from_the_regex_is_an_error():
    with pytest.raises(ConstraintError, match="leaf p0x1 vanished"):
        _splice('"p0x0"', "p0x", {"p0x0": "a", "p0x1": "b"})


def test_many_leaves_in_a_schema_are_all_spliced():
    # Each bounded number is a leaf; 300 of them, each named once in the regex.
    props = {f"n{i}": {"type": "integer", "minimum": i, "maximum": i + 5} for i in range(300)}
    schema = {"type": "object", "properties": props, "required": list(props)}
    regex = to_regex(Constraint.json_schema(schema)).regex
    assert "gclm" not in regex
    text = "{" + ", ".join(f'"n{i}": {i + 3}' for i in range(300)) + "}"
    assert re.fullmatch(regex, text)
    assert not re.fullmatch(regex, text.replace('"n7": 10', '"n7": 13'))
