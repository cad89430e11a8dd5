"""Parameters gclm accepts only at a value that leaves the output unchanged.

OpenAI clients send some parameters gclm does not implement (`echo`, `best_of`, `moderation`,
`background`, ...) at their neutral value: `echo: false`, `best_of: 1`, `null`. Those are
accepted; any other value is a 400 naming the parameter and the fix. `Neutral` states the
accepted values once, and both the check and the OpenAPI document (`enum`) read them, so a
fuzzer or a generated client is never told a value is valid that the server then refuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gclm.server.openai.json_values import json_equal

# What `not v` accepts, in JSON: the neutral values of a flag, a count, a text or a list.
FALSY: tuple[Any, ...] = (False, 0, "", [], {})


@dataclass(frozen=True)
class Neutral:
    """A parameter accepted at null or one of `values`; `fix` tells the user what to send."""

    fix: str
    values: tuple[Any, ...] = ()

    def accepts(self, value: Any) -> bool:
        return value is None or any(json_equal(value, v) for v in self.values)

    def schema(self) -> dict[str, Any]:
        """The JSON Schema of the accepted values (for the OpenAPI document)."""
        return {"enum": [None, *self.values]}


@dataclass(frozen=True)
class NeutralOptions(Neutral):
    """An options object accepted when null, or an object whose every value is neutral
    (clients send `"reasoning": {"effort": null}` for "no reasoning options")."""

    def accepts(self, value: Any) -> bool:
        if not isinstance(value, dict):
            return value is None
        return all(Neutral.accepts(self, v) for v in value.values())

    def schema(self) -> dict[str, Any]:
        return {
            "anyOf": [
                {"type": "null"},
                {"type": "object", "additionalProperties": super().schema()},
            ]
        }
