"""The regex size limit: 3 M characters, checked before outlines-core builds anything."""

from __future__ import annotations

import pytest

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex
from gclm.errors import CompileLimitError


def enum_schema(total_chars: int) -> dict:
    words = [f"{i:08d}" * 10 for i in range(total_chars // 80)]
    return {"type": "object", "properties": {"w": {"enum": words}}, "required": ["w"]}


def test_a_two_million_character_regex_is_built():
    # Refused under the old 1 M limit; kb_449 and kb_1112 (1.3 M, 2.4 M) compile in seconds.
    regex = to_regex(Constraint.json_schema(enum_schema(2_000_000))).regex
    assert len(regex) > 2_000_000


def test_past_three_million_characters_is_refused_up_front():
    with pytest.raises(CompileLimitError, match=r"limit 3,000,000"):
        to_regex(Constraint.json_schema(enum_schema(3_200_000)))
