"""The Responses API's `input` items: messages, and the function and custom tool calls and
their outputs of earlier turns (responses/protocol.py turns them into chat messages for the
template).

Content parts are flattened to their text; the fields an earlier output item carries when it
is sent back (`id`, `status`, ...) are accepted and change nothing. A stored response keeps
its input items as `stored_item` writes them, and a turn chained to it by
`previous_response_id` reads them back with `read_items`.
"""

from __future__ import annotations

import secrets
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

_TEXT_PARTS = ("input_text", "output_text", "text")
INPUT_ITEMS = (
    "message",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


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
_FUNCTION_CALL_SCHEMA = {
    "type": "object",
    "properties": {
        "type": {"const": "function_call"},
        "call_id": {"type": "string"},
        "name": {"type": "string"},
        "arguments": {"type": "string"},
        "id": {"type": ["string", "null"]},
        "status": {"type": ["string", "null"]},
        "namespace": {"type": ["string", "null"]},
        "caller": {},
        "async": {},
    },
    "required": ["type", "call_id", "name", "arguments"],
    "additionalProperties": False,
}
_FUNCTION_CALL_OUTPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "type": {"const": "function_call_output"},
        "call_id": {"type": "string"},
        "output": {"anyOf": [{"type": "string"}, _PARTS_SCHEMA]},
        "id": {"type": ["string", "null"]},
        "status": {"type": ["string", "null"]},
        "name": {"type": ["string", "null"]},
        "namespace": {"type": ["string", "null"]},
        "caller": {},
    },
    "required": ["type", "call_id", "output"],
    "additionalProperties": False,
}
_CUSTOM_CALL_SCHEMA = {
    "type": "object",
    "properties": {
        "type": {"const": "custom_tool_call"},
        "call_id": {"type": "string"},
        "name": {"type": "string"},
        "input": {"type": "string"},
        "id": {"type": ["string", "null"]},
        "status": {"type": ["string", "null"]},
    },
    "required": ["type", "call_id", "name", "input"],
    "additionalProperties": False,
}
_CUSTOM_CALL_OUTPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "type": {"const": "custom_tool_call_output"},
        "call_id": {"type": "string"},
        "output": {"anyOf": [{"type": "string"}, _PARTS_SCHEMA]},
        "id": {"type": ["string", "null"]},
        "status": {"type": ["string", "null"]},
    },
    "required": ["type", "call_id", "output"],
    "additionalProperties": False,
}
INPUT_SCHEMA = {
    "anyOf": [
        {"type": "string"},
        {
            "type": "array",
            "items": {
                "anyOf": [
                    _MESSAGE_SCHEMA,
                    _FUNCTION_CALL_SCHEMA,
                    _FUNCTION_CALL_OUTPUT_SCHEMA,
                    _CUSTOM_CALL_SCHEMA,
                    _CUSTOM_CALL_OUTPUT_SCHEMA,
                ]
            },
            "minItems": 1,
        },
    ]
}


def _flatten_parts(v: Any) -> Any:
    """Content parts (a list) as their text joined by newlines; anything else unchanged."""
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
        return _flatten_parts(v)


class FunctionCallItem(_Strict):
    """An earlier turn's `function_call` output item, sent back as input."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str  # JSON text, as the output item had it
    # An earlier output item sent back carries these; they change nothing.
    id: str | None = None
    status: str | None = None
    namespace: str | None = None
    caller: Any = None
    async_: Any = Field(default=None, alias="async")


class FunctionCallOutputItem(_Strict):
    """The result of a function call, for the model's next turn."""

    type: Literal["function_call_output"]
    call_id: str
    output: str
    # Echoes of the call it answers; they change nothing.
    id: str | None = None
    status: str | None = None
    name: str | None = None
    namespace: str | None = None
    caller: Any = None

    @field_validator("output", mode="before")
    @classmethod
    def _text_parts(cls, v: Any) -> Any:
        return _flatten_parts(v)


class CustomToolCallItem(_Strict):
    """An earlier turn's `custom_tool_call` output item, sent back as input."""

    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str
    id: str | None = None
    status: str | None = None


class CustomToolCallOutputItem(_Strict):
    """The result of a custom tool call, for the model's next turn."""

    type: Literal["custom_tool_call_output"]
    call_id: str
    output: str
    id: str | None = None
    status: str | None = None

    @field_validator("output", mode="before")
    @classmethod
    def _text_parts(cls, v: Any) -> Any:
        return _flatten_parts(v)


InputItem = Annotated[
    InputMessage
    | FunctionCallItem
    | FunctionCallOutputItem
    | CustomToolCallItem
    | CustomToolCallOutputItem,
    Field(discriminator="type"),
]

# The id of an input item sent without one, as OpenAI's stored items have.
_ID_PREFIXES = {
    "message": "msg_",
    "function_call": "fc_",
    "function_call_output": "fco_",
    "custom_tool_call": "ctc_",
    "custom_tool_call_output": "ctco_",
}
_ITEMS: TypeAdapter[list[InputItem]] = TypeAdapter(list[InputItem])


def stored_item(item: InputItem) -> dict[str, Any]:
    """An input item as a stored response keeps it (and GET .../input_items lists it): with
    an id, a message's text as one content part (`output_text` for the assistant's)."""
    data = item.model_dump(by_alias=True, exclude_none=True)
    if "id" not in data:
        data["id"] = _ID_PREFIXES[item.type] + secrets.token_hex(12)
    if isinstance(item, InputMessage):
        if item.role == "assistant":
            data["content"] = [{"type": "output_text", "text": item.content, "annotations": []}]
            data.setdefault("status", "completed")
        else:
            data["content"] = [{"type": "input_text", "text": item.content}]
    return data


def read_items(stored: list[dict[str, Any]]) -> list[InputItem]:
    """Stored input and output items as input items again. Reasoning items stay stored but
    are left out: chat templates drop an earlier turn's thinking, and so does the prompt."""
    return _ITEMS.validate_python([item for item in stored if item.get("type") != "reasoning"])
