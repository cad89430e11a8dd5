"""Rules across a request's fields, as JSON Schema for the OpenAPI document.

The validators in protocol.py and tools/prompt.py refuse these combinations with a 400; the
document states them too, so that a body the document calls valid is one the server accepts
(schemathesis checks both ways in tests/server/test_openapi.py). Rules a schema cannot state
(a budget below the constraint's minimum, two tools of one name, max_tokens disagreeing with
max_completion_tokens) stay in the code alone.
"""

from __future__ import annotations

from typing import Any

NULL: dict[str, Any] = {"type": "null"}

# tool_choice "required", or naming a function, needs tools (tools/prompt.py: tool_plan).
TOOL_CHOICE_NEEDS_TOOLS: dict[str, Any] = {
    "if": {
        "required": ["tool_choice"],
        "properties": {"tool_choice": {"anyOf": [{"const": "required"}, {"type": "object"}]}},
    },
    "then": {"required": ["tools"], "properties": {"tools": {"type": "array", "minItems": 1}}},
}

# Chat's top_logprobs needs logprobs: true (ChatCompletionRequest.check_supported).
TOP_LOGPROBS_NEEDS_LOGPROBS: dict[str, Any] = {
    "if": {"required": ["top_logprobs"], "properties": {"top_logprobs": {"not": NULL}}},
    "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}},
}

# A format of type "json_schema" needs its schema: chat's response_format nests it in
# `json_schema` (constraint_spec.py), the Responses API's text.format has it at the top.
_IS_JSON_SCHEMA: dict[str, Any] = {
    "required": ["type"],
    "properties": {"type": {"const": "json_schema"}},
}
_HAS_SCHEMA: dict[str, Any] = {"required": ["schema"], "properties": {"schema": {"not": NULL}}}
TEXT_FORMAT_NEEDS_SCHEMA: dict[str, Any] = {"if": _IS_JSON_SCHEMA, "then": _HAS_SCHEMA}
FORMAT_NEEDS_SCHEMA: dict[str, Any] = {
    "if": _IS_JSON_SCHEMA,
    "then": {
        "required": ["json_schema"],
        "properties": {"json_schema": {"type": "object", **_HAS_SCHEMA}},
    },
}

# Each constraint source when it sets no constraint (constraint_spec.py reads them).
_UNSET: dict[str, Any] = {
    "response_format": {
        "anyOf": [NULL, {"type": "object", "properties": {"type": {"const": "text"}}}]
    },
    "structured_outputs": NULL,
    "guided_json": NULL,
    "guided_regex": NULL,
    "guided_choice": NULL,
    "guided_grammar": NULL,
}
# Tools ask for a constraint unless there are none or tool_choice is "none".
_NO_TOOL_CALLS: dict[str, Any] = {
    "anyOf": [
        {"properties": {"tools": {"anyOf": [NULL, {"type": "array", "maxItems": 0}]}}},
        {"required": ["tool_choice"], "properties": {"tool_choice": {"const": "none"}}},
    ]
}


def set_(key: str) -> dict[str, Any]:
    """The JSON Schema of an object whose `key` is present and not null."""
    return {"required": [key], "properties": {key: {"not": NULL}}}


def one_constraint(*, tools: bool) -> dict[str, Any]:
    """At most one source sets a constraint: one branch per source that may, with every
    other source unset (the form generators handle well, unlike `not` over pairs). A
    response_format may stand beside tools: it is the form of a text answer
    (tools/prompt.py), so the tools' branch leaves it free."""
    branches: list[dict[str, Any]] = []
    for source in [*_UNSET, *(["tools"] if tools else [])]:
        free = {source, "response_format"} if source == "tools" else {source}
        others: dict[str, Any] = {"properties": {k: v for k, v in _UNSET.items() if k not in free}}
        if tools and source not in ("tools", "response_format"):
            others = {"allOf": [others, _NO_TOOL_CALLS]}
        branches.append(others)
    return {"anyOf": branches}
