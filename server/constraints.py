"""Which constraint a request asks for, and which parameter to blame when it is wrong.

A constraint comes from exactly one of: `response_format` (json_object / json_schema), the
`structured_outputs` extension ({json | regex | choice, budget_aware}), or vLLM's older
`guided_json` / `guided_regex` / `guided_choice`. Errors name the parameter the constraint
came from, e.g. `structured_outputs.regex`, both when the constraint is malformed here and
when the engine fails to compile it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gclm.compiler.constraint import Constraint
from gclm.errors import ConstraintError, InvalidRequestError
from gclm.server.protocol import OpenAIRequest, ResponseFormat, StructuredOutputs


@dataclass(frozen=True)
class ConstraintSpec:
    """A request's constraint and the parameter it came from (named in its errors)."""

    constraint: Constraint
    param: str
    budget_aware: bool


def constraint_spec(request: OpenAIRequest) -> ConstraintSpec | None:
    """The constraint `request` asks for, or None for free text.

    Raises InvalidRequestError when more than one source sets a constraint or a source is
    incomplete, and ConstraintError (param naming the source) when it is malformed.
    """
    fmt = request.response_format
    sources: dict[str, Any] = {
        "response_format": fmt if fmt is not None and fmt.type != "text" else None,
        "structured_outputs": request.structured_outputs,
        "guided_json": request.guided_json,
        "guided_regex": request.guided_regex,
        "guided_choice": request.guided_choice,
    }
    given = [(name, value) for name, value in sources.items() if value is not None]
    if not given:
        return None
    if len(given) > 1:
        raise InvalidRequestError(
            f"Both {given[0][0]} and {given[1][0]} ask for a constraint; set only one.",
            param=given[1][0],
            code="conflicting_parameters",
        )
    source, value = given[0]
    param, kind, argument, budget_aware = _READERS[source](value)
    try:
        return ConstraintSpec(_FACTORIES[kind](argument), param, budget_aware)
    except ConstraintError as e:
        raise with_param(e, param) from None


# What a constraint source asks for: (the param its errors name, a Constraint factory's name,
# the factory's argument, budget_aware).
_Source = tuple[str, str, Any, bool]

_FACTORIES: dict[str, Callable[[Any], Constraint]] = {
    "json_schema": Constraint.json_schema,
    "json_object": lambda _: Constraint.json_object(),
    "regex": Constraint.regex,
    "choice": Constraint.choice,
}


def _read_response_format(fmt: ResponseFormat) -> _Source:
    if fmt.type == "json_object":
        return "response_format", "json_object", None, True
    schema = fmt.json_schema.schema_ if fmt.json_schema else None
    if schema is None:
        raise InvalidRequestError(
            "response_format of type json_schema needs json_schema.schema: "
            '{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}.',
            param="response_format.json_schema.schema",
            code="missing_required_parameter",
        )
    return "response_format", "json_schema", schema, True


def _read_structured_outputs(so: StructuredOutputs) -> _Source:
    kinds: dict[str, tuple[str, Any]] = {
        "json": ("json_schema", so.json_),
        "regex": ("regex", so.regex),
        "choice": ("choice", so.choice),
    }
    given = [name for name, (_, value) in kinds.items() if value is not None]
    if len(given) != 1:
        raise InvalidRequestError(
            "structured_outputs needs exactly one of json, regex or choice; got "
            f"{', '.join(given) or 'none'}.",
            param="structured_outputs",
            code="invalid_structured_outputs",
        )
    kind, value = kinds[given[0]]
    return f"structured_outputs.{given[0]}", kind, value, so.budget_aware


_READERS: dict[str, Callable[[Any], _Source]] = {
    "response_format": _read_response_format,
    "structured_outputs": _read_structured_outputs,
    "guided_json": lambda v: ("guided_json", "json_schema", v, True),
    "guided_regex": lambda v: ("guided_regex", "regex", v, True),
    "guided_choice": lambda v: ("guided_choice", "choice", v, True),
}


def with_param(exc: ConstraintError, param: str) -> ConstraintError:
    """A copy of `exc` naming `param` (the engine may cache and re-raise one instance)."""
    if exc.param == param:
        return exc
    named = copy.copy(exc)
    named.param = param
    return named
