"""Whether a JSON schema's compiled regex accepts a value: the test files' shared check."""

from __future__ import annotations

import json
import re
from typing import Any

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex


def accepts_text(schema: Any, text: str, additional_properties: str = "declared") -> bool:
    """`text` matches `schema`'s regex."""
    constraint = Constraint.json_schema(schema, additional_properties=additional_properties)
    return re.fullmatch(to_regex(constraint).regex, text) is not None


def accepts(schema: Any, value: Any, additional_properties: str = "declared") -> bool:
    """`value`, serialized as compact JSON, matches `schema`'s regex."""
    text = json.dumps(value, separators=(",", ":"))
    return accepts_text(schema, text, additional_properties)
