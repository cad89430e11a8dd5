"""Whether a JSON schema's compiled regex accepts a value: the test files' shared check."""

from __future__ import annotations

import json
import re
from typing import Any

from gclm.compiler.constraint import Constraint
from gclm.compiler.regex import to_regex


def accepts_text(schema: Any, text: str) -> bool:
    """`text` matches `schema`'s regex."""
    return re.fullmatch(to_regex(Constraint.json_schema(schema)).regex, text) is not None


def accepts(schema: Any, value: Any) -> bool:
    """`value`, serialized as compact JSON, matches `schema`'s regex."""
    return accepts_text(schema, json.dumps(value, separators=(",", ":")))
