"""What a request asks for: a JSON Schema, any JSON object, a regex, or a choice of strings."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gclm.errors import ConstraintError

# Between JSON tokens allow at most one space. outlines-core's default, [\n\t ]*, lets a
# model spend its whole budget on whitespace.
DEFAULT_WHITESPACE = r"[ ]?"

KINDS = ("json_schema", "json_object", "regex", "choice")


@dataclass(frozen=True)
class Constraint:
    """A constraint in canonical form: `spec` is text, so the dataclass is hashable.

    - json_schema: `spec` is the schema as compact JSON. Keys keep their order: the order of
      `properties` is the order in which the output writes them.
    - json_object: `spec` is ""
    - regex: `spec` is the pattern
    - choice: `spec` is the JSON list of choices
    """

    kind: str
    spec: str
    whitespace: str = DEFAULT_WHITESPACE

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConstraintError(f"Unknown constraint kind {self.kind!r}; use one of {KINDS}.")

    @classmethod
    def json_schema(
        cls, schema: dict[str, Any] | bool | str, whitespace: str = DEFAULT_WHITESPACE
    ) -> Constraint:
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ConstraintError(f"The JSON Schema is not valid JSON: {e}.") from e
        if not isinstance(schema, dict | bool):
            raise ConstraintError(
                f"A JSON Schema must be an object (or true/false), got {type(schema).__name__}."
            )
        return cls("json_schema", canonical_json(schema), whitespace)

    @classmethod
    def json_object(cls, whitespace: str = DEFAULT_WHITESPACE) -> Constraint:
        return cls("json_object", "", whitespace)

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        if not isinstance(pattern, str) or not pattern:
            raise ConstraintError("A regex constraint must be a non-empty string.")
        return cls("regex", pattern)

    @classmethod
    def choice(cls, choices: list[str]) -> Constraint:
        if (
            not isinstance(choices, list | tuple)
            or not choices
            or not all(isinstance(c, str) for c in choices)
        ):
            raise ConstraintError("A choice constraint must be a non-empty list of strings.")
        return cls("choice", json.dumps(list(choices), ensure_ascii=False))

    def key_material(self) -> str:
        """Canonical text that identifies this constraint (for the cache key)."""
        return json.dumps([self.kind, self.spec, self.whitespace], ensure_ascii=False)


def canonical_json(value: Any) -> str:
    """Compact JSON. Not key-sorted: property order is part of a schema's meaning here."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
