"""POST /v1/chat/completions: the request (messages, tools, logprobs, reasoning controls).

The fields it shares with text completions are `OpenAIRequest`'s (server/openai/protocol.py).
"""

from __future__ import annotations

from functools import cached_property
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from typing_extensions import Self

from gclm.errors import InvalidRequestError, quote
from gclm.server.openai.json_values import OptionalJsonInt
from gclm.server.openai.neutral import FALSY, Neutral
from gclm.server.openai.protocol import MAX_TOP_LOGPROBS, OpenAIRequest, _nullable, _Strict
from gclm.server.openai.reasoning import ReasoningFields
from gclm.server.openai.request_rules import (
    TOOL_CHOICE_NEEDS_TOOLS,
    TOP_LOGPROBS_NEEDS_LOGPROBS,
    one_constraint,
)
from gclm.server.openai.tools.prompt import (
    AllowedToolsChoice,
    NamedToolChoice,
    ToolCallIn,
    ToolChoice,
    ToolDef,
    ToolPlan,
    tool_plan,
)

_CONTENT_SCHEMA = {
    "anyOf": [
        {"type": "string"},
        {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
                "required": ["type", "text"],
            },
        },
    ]
}
_NULLABLE_CONTENT_SCHEMA = {"anyOf": [*_CONTENT_SCHEMA["anyOf"], {"type": "null"}]}


class ChatMessage(_Strict):
    # What _content_or_calls enforces, for the OpenAPI document: content, or an assistant
    # turn's tool_calls.
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "anyOf": [
                {"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}},
                {
                    "required": ["role", "tool_calls"],
                    "properties": {
                        "role": {"const": "assistant"},
                        "tool_calls": {"type": "array", "minItems": 1},
                    },
                },
            ],
            # ... and tool_calls on assistant turns only.
            "if": {
                "required": ["tool_calls"],
                "properties": {"tool_calls": {"type": "array", "minItems": 1}},
            },
            "then": {"properties": {"role": {"const": "assistant"}}},
        },
    )

    role: Literal["system", "developer", "user", "assistant", "tool"]
    # None only on an assistant message with tool_calls
    content: Annotated[str | None, WithJsonSchema(_NULLABLE_CONTENT_SCHEMA)] = None
    name: str | None = None
    refusal: str | None = None  # an earlier assistant refusal; ignored
    tool_calls: list[ToolCallIn] | None = None  # an earlier assistant turn's calls
    tool_call_id: str | None = None  # on a tool message: the call it answers

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, v: Any) -> Any:
        """Flatten a list of text parts; other parts (images, audio, files) are refused."""
        if not isinstance(v, list):
            return v
        texts = []
        for part in v:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                raise ValueError(
                    f"content part of type {quote(kind)} is not supported; gclm accepts text "
                    "and {'type': 'text', 'text': ...} parts only"
                )
            texts.append(part["text"])
        return "\n".join(texts)

    @model_validator(mode="after")
    def _content_or_calls(self) -> Self:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        return self

    def for_template(self) -> dict[str, Any]:
        """The message as the chat template sees it (tools.prompt_messages writes the
        calls and tool results into it)."""
        # Chat templates predate the "developer" role, which OpenAI defines as the new
        # name of "system".
        role = "system" if self.role == "developer" else self.role
        out: dict[str, Any] = {"role": role, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class ChatCompletionRequest(OpenAIRequest, ReasoningFields):
    """POST /v1/chat/completions (reasoning controls: server/openai/reasoning.py)."""

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                TOOL_CHOICE_NEEDS_TOOLS,
                TOP_LOGPROBS_NEEDS_LOGPROBS,
                one_constraint(tools=True),
            ]
        }
    )

    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: StrictBool = Field(default=False, json_schema_extra=_nullable)
    top_logprobs: OptionalJsonInt = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS, strict=True)
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None  # None: true, as at OpenAI
    functions: Any = None
    function_call: Any = None
    modalities: Any = None
    audio: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    moderation: Any = None
    prediction: Any = None  # only speeds up generation at OpenAI; the output is unchanged

    _SUPPORTED_ONLY: ClassVar[dict[str, Neutral]] = {
        **OpenAIRequest._SUPPORTED_ONLY,
        "functions": Neutral("use tools instead (functions is deprecated)", FALSY),
        "function_call": Neutral("use tool_choice instead", ("none", "auto")),
        "modalities": Neutral('remove it or set it to ["text"]', (["text"],)),
        "audio": Neutral("remove it; gclm generates text only"),
        "verbosity": Neutral("remove it"),
        "web_search_options": Neutral("remove it; gclm does not search the web"),
        "moderation": Neutral("remove it"),
    }

    @field_validator("logprobs", mode="before")
    @classmethod
    def _null_is_false(cls, v: Any) -> Any:
        return False if v is None else v

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice(cls, v: Any) -> Any:
        # One clear message instead of pydantic's per-union-member errors.
        if v is None or v in ("none", "auto", "required"):
            return v
        if isinstance(v, dict):
            kind = AllowedToolsChoice if v.get("type") == "allowed_tools" else NamedToolChoice
            try:
                return kind.model_validate(v)
            except ValidationError:
                pass
        raise ValueError(
            'use "none", "auto", "required", {"type": "function", "function": {"name": ...}}, '
            '{"type": "custom", "custom": {"name": ...}} or {"type": "allowed_tools", '
            '"allowed_tools": {"mode": "auto" or "required", "tools": [...]}}'
        )

    def check_supported(self) -> None:
        super().check_supported()
        self.tool_plan  # noqa: B018 (raises InvalidRequestError for a tool_choice it cannot honour)
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequestError(
                "top_logprobs needs logprobs: set logprobs to true, or remove top_logprobs.",
                param="top_logprobs",
                code="invalid_value",
            )

    @property
    def logprobs_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @cached_property
    def tool_plan(self) -> ToolPlan | None:
        """What the tools ask of the output (None: no tools); see server/openai/tools/prompt.py."""
        return tool_plan(self.tools, self.tool_choice, self.parallel_tool_calls)

    def constraint_sources(self) -> dict[str, Any]:
        plan = self.tool_plan
        return {
            **super().constraint_sources(),
            "tools": plan if plan and plan.calls_allowed else None,
        }
