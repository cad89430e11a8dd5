"""The Responses API's request: POST /v1/responses, parsed and turned into chat messages.

    body = ResponsesRequest.parse(raw)       # 400 for what gclm cannot honour
    messages = body.messages()               # instructions + input, for the chat template

It shares everything else with chat completions: the sampling fields (`SamplingFields`),
the constraint reader (`text.format`, in constraints.py), the budget check (naming
`max_output_tokens`) and the generation path in app.py. Its bodies and stream events are
built by `ResponsesRenderer` (responses_render.py).

gclm is stateless: nothing is stored, so `previous_response_id`, `conversation`, `prompt`
(a stored template) and `background` are a 400; `store` is accepted and has no effect (the
output is the same; the response just cannot be fetched later).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from typing_extensions import Self

from gclm.server.openai.protocol import MAX_TOP_LOGPROBS, SamplingFields, _nullable

# The `include` value that asks for logprobs; OpenAI's other values name data gclm never
# produces (reasoning, tool results), so they change nothing and are accepted. A value
# OpenAI does not define is a 400 (a typo would otherwise silently drop the logprobs).
INCLUDE_LOGPROBS = "message.output_text.logprobs"
Include = Literal[
    "message.output_text.logprobs",
    "reasoning.encrypted_content",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "code_interpreter_call.outputs",
]
# What _no_reasoning accepts, for the OpenAPI document.
_NO_REASONING_SCHEMA = {
    "anyOf": [
        {"type": "null"},
        {"type": "object", "additionalProperties": {"enum": [None, "", 0, False, {}, []]}},
    ]
}
_TEXT_PARTS = ("input_text", "output_text", "text")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextFormat(_Strict):
    """`text.format`: free text, any JSON object, or a JSON Schema (name, schema and strict
    at the top level, unlike chat's response_format)."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    # "schema" would shadow BaseModel.schema; the alias keeps the wire name. Any: the one
    # constraint parser checks it, and its error names text.format.schema.
    schema_: Any = Field(default=None, alias="schema")
    strict: StrictBool | None = None  # gclm always enforces the schema, strict or not
    description: str | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> Self:
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError('a format of type "json_schema" needs "schema": {...}')
        return self


class TextConfig(_Strict):
    format: TextFormat | None = None
    # "medium" is the default; another verbosity would change the output and is refused.
    verbosity: Literal["medium"] | None = None


# What the "before" validators below accept, for the OpenAPI document (server/http/openapi.py).
_PARTS_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"type": {"enum": sorted(_TEXT_PARTS)}, "text": {"type": "string"}},
        "required": ["type", "text"],
    },
}
_MESSAGE_SCHEMA = {
    "type": "object",
    "properties": {
        "type": {"const": "message"},
        "role": {"enum": ["user", "assistant", "system", "developer"]},
        "content": {"anyOf": [{"type": "string"}, _PARTS_SCHEMA]},
        "id": {"type": ["string", "null"]},
        "status": {"type": ["string", "null"]},
        "phase": {"type": ["string", "null"]},
    },
    "required": ["role", "content"],
    "additionalProperties": False,
}
_INPUT_SCHEMA = {
    "anyOf": [{"type": "string"}, {"type": "array", "items": _MESSAGE_SCHEMA, "minItems": 1}]
}


class InputMessage(_Strict):
    """A message item of `input`; content parts are flattened to their text."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str
    # An earlier output item sent back as input carries these; they change nothing.
    id: str | None = None
    status: str | None = None
    phase: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, v: Any) -> Any:
        if not isinstance(v, list):
            return v
        texts = []
        for part in v:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "refusal":
                continue  # an earlier refusal, as chat's `refusal` field: not model input
            if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
                raise ValueError(
                    f"content part of type {kind!r} is not supported; gclm accepts text and "
                    "{'type': 'input_text', 'text': ...} parts only"
                )
            texts.append(part["text"])
        return "\n".join(texts)


def _none(v: Any) -> bool:
    return v is None


def _no_reasoning(v: Any) -> bool:
    """None, {} or {"effort": None, ...}: clients send these for "no reasoning options"."""
    return v is None or (isinstance(v, dict) and not any(v.values()))


class ResponsesRequest(SamplingFields):
    """POST /v1/responses. `input` (a string is one user message) becomes a list of messages.

    temperature, top_p, seed, the penalties and logit_bias are SamplingFields' (the last
    four as extensions, as on chat). Unknown fields are refused.
    """

    n: ClassVar[int] = 1  # one output per response

    model: str | None = None
    input: Annotated[list[InputMessage], WithJsonSchema(_INPUT_SCHEMA)] = Field(min_length=1)
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, strict=True)
    stream: StrictBool = Field(default=False, json_schema_extra=_nullable)
    text: TextConfig | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS, strict=True)
    include: list[Include] | None = None

    # Accepted and ignored: none of these changes the generated text.
    store: StrictBool | None = None  # nothing is stored either way
    stream_options: Any = None  # include_obfuscation: transport only
    metadata: Any = None
    user: Any = None
    safety_identifier: Any = None
    service_tier: Any = None
    prompt_cache_key: Any = None
    prompt_cache_retention: Any = None
    parallel_tool_calls: Any = None  # meaningless without tools
    max_tool_calls: Any = None
    truncation: Literal["auto", "disabled"] | None = None  # gclm never truncates: a long
    # input is a 400 naming the context length, never a silently shortened one

    # Accepted only at a value that leaves the output unchanged.
    previous_response_id: Any = None
    conversation: Any = None
    prompt: Any = None
    background: Any = None
    tools: Any = None
    tool_choice: Any = None
    reasoning: Annotated[Any, WithJsonSchema(_NO_REASONING_SCHEMA)] = None

    _SUPPORTED_ONLY: ClassVar[dict[str, tuple[Callable[[Any], bool], str]]] = {
        "previous_response_id": (
            _none,
            "gclm stores no responses; send the earlier turns in `input` instead",
        ),
        "conversation": (_none, "gclm stores no conversations; send the turns in `input`"),
        "prompt": (_none, "gclm stores no prompt templates; send the text in `input`"),
        "background": (lambda v: not v, "remove it or set it to false"),
        "tools": (lambda v: not v, "remove it; gclm does not call tools"),
        "tool_choice": (lambda v: v in (None, "none", "auto"), "remove it"),
        "reasoning": (
            _no_reasoning,
            "remove it; the model does not reason before answering",
        ),
    }

    @field_validator("stream", mode="before")
    @classmethod
    def _null_is_false(cls, v: Any) -> Any:
        return False if v is None else v

    @field_validator("input", mode="before")
    @classmethod
    def _only_messages(cls, v: Any) -> Any:
        """A string is one user message; name an item type that is not a message (function
        calls, reasoning, ...)."""
        if isinstance(v, str):
            return [{"role": "user", "content": v}]
        if isinstance(v, list):
            for item in v:
                kind = item.get("type", "message") if isinstance(item, dict) else None
                if kind != "message":
                    raise ValueError(
                        f"input items of type {kind!r} are not supported; gclm accepts "
                        "messages ({'role': ..., 'content': ...}) only"
                    )
        return v

    @property
    def include_usage(self) -> bool:
        return True  # response.completed always carries usage

    @property
    def logprobs_count(self) -> int | None:
        """Logprobs are sent when `include` asks for them, with `top_logprobs` top ones."""
        if self.include and INCLUDE_LOGPROBS in self.include:
            return self.top_logprobs or 0
        return None

    def constraint_sources(self) -> dict[str, Any]:
        fmt = self.text.format if self.text is not None else None
        return {"text.format": fmt if fmt is not None and fmt.type != "text" else None}

    def budget_request(self) -> tuple[int | None, str]:
        return self.max_output_tokens, "max_output_tokens"

    def messages(self) -> list[dict[str, Any]]:
        """`instructions` as a system message, then `input`, as the chat template sees them."""
        out: list[dict[str, Any]] = []
        if self.instructions:
            out.append({"role": "system", "content": self.instructions})
        for item in self.input:
            # Chat templates predate "developer", OpenAI's new name for "system".
            role = "system" if item.role == "developer" else item.role
            out.append({"role": role, "content": item.content})
        return out
