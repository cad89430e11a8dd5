"""POST /v1/completions: the request (a prompt or several, as text or token ids).

The fields it shares with chat are `OpenAIRequest`'s (server/openai/protocol.py).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import ConfigDict, Field, WithJsonSchema, field_validator

from gclm.server.openai.json_values import OptionalJsonInt, integral
from gclm.server.openai.neutral import FALSY, Neutral
from gclm.server.openai.protocol import MAX_TOP_LOGPROBS, OpenAIRequest
from gclm.server.openai.request_rules import one_constraint

_TOKENS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
_PROMPT_SCHEMA = {
    "anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1},
        _TOKENS,
        {"type": "array", "items": _TOKENS, "minItems": 1},
    ]
}


class CompletionRequest(OpenAIRequest):
    """POST /v1/completions. `prompt` becomes a list of texts or a list of token-id lists."""

    model_config = ConfigDict(json_schema_extra=one_constraint(tools=False))

    prompt: Annotated[list[str] | list[list[int]], WithJsonSchema(_PROMPT_SCHEMA)]
    # The sampled token's logprob and this many top ones per token (None: no logprobs).
    logprobs: OptionalJsonInt = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS, strict=True)
    echo: Any = None
    best_of: Any = None
    suffix: Any = None

    _SUPPORTED_ONLY: ClassVar[dict[str, Neutral]] = {
        **OpenAIRequest._SUPPORTED_ONLY,
        "echo": Neutral("remove it or set it to false", (False,)),
        "best_of": Neutral("remove it or set it to 1; use n for several samples", (1,)),
        "suffix": Neutral("remove it; gclm does not insert text", FALSY),
    }

    @property
    def logprobs_count(self) -> int | None:
        return self.logprobs

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_list(cls, v: Any) -> Any:
        if v == "" or (isinstance(v, list) and "" in v):
            raise ValueError("prompt must not be an empty string")
        if isinstance(v, str):
            return [v]
        if isinstance(v, list) and v:
            v = [[integral(t) for t in p] if isinstance(p, list) else integral(p) for p in v]
            if all(isinstance(p, str) for p in v):
                return v
            if all(_is_token_ids(p) for p in v):
                return v
            if _is_token_ids(v):
                return [v]
        raise ValueError(
            "prompt must be a string, a list of strings, a list of token ids, or a list of "
            "token-id lists (non-empty, ids >= 0)"
        )


def _is_token_ids(v: Any) -> bool:
    return (
        isinstance(v, list)
        and bool(v)
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in v)
    )
