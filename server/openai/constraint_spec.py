"""Which constraint a request asks for, and which parameter to blame when it is wrong.

A constraint comes from exactly one of: `response_format` (json_object / json_schema), the
`structured_outputs` extension ({json | regex | choice | grammar, budget_aware}), or vLLM's
older `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar` (a grammar in Lark,
or in GBNF, which gbnf.py writes as Lark); on the Responses API, from `text.format`
(json_object / json_schema with `name`, `schema`, `strict` at its top level); or, on
either API, from `tools` when `tool_choice` allows calls (server/openai/tools/prompt.py),
which a JSON `response_format` / `text.format` may join as the form of a text answer. Each
is read by the one constraint parser, `gclm.compiler.front.constraint.parse_constraint`. Errors
name the parameter the constraint came from, e.g. `structured_outputs.regex`, both when
the constraint is malformed here and when the engine fails to compile it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from starlette.responses import Response

from gclm.compiler import STRUCTURED_KEYS, Constraint, json_regex, parse_constraint
from gclm.errors import ConstraintError, InvalidRequestError
from gclm.server.openai.gbnf import to_lark
from gclm.server.openai.protocol import (
    GenerationBody,
    OpenAIRequest,
    ResponseFormat,
    StructuredOutputs,
)
from gclm.server.openai.responses.protocol import TextFormat
from gclm.server.openai.tools.prompt import CallFormat, ToolPlan


@dataclass(frozen=True)
class ConstraintSpec:
    """A request's constraint and the parameter it came from (named in its errors)."""

    constraint: Constraint
    param: str
    budget_aware: bool
    budget_policy: str = "graceful"  # masking.graceful.POLICY_NAMES
    calls: CallFormat | None = None  # tools: how the calls are written


def constraint_spec(
    request: GenerationBody, additional_properties: str = "declared"
) -> ConstraintSpec | None:
    """The constraint `request` asks for, or None for free text. `additional_properties`
    is the server's default for JSON Schemas (compiler/front/constraint.py).

    Raises InvalidRequestError when more than one source sets a constraint (tools beside a
    JSON `response_format` / `text.format` are one constraint: see `_tools_with_format`),
    and ConstraintError (param naming the source) when one is malformed or incomplete.
    """
    sources = request.constraint_sources()
    given = [(name, value) for name, value in sources.items() if value is not None]
    if not given:
        return None
    names = [name for name, _ in given]
    if len(given) == 2 and "tools" in names and set(names) & set(FORMAT_SOURCES):
        fmt_source, fmt = given[1 - names.index("tools")]
        return _tools_with_format(sources["tools"], fmt_source, fmt, additional_properties)
    if len(given) > 1:
        raise InvalidRequestError(
            f"Both {given[0][0]} and {given[1][0]} ask for a constraint; set only one.",
            param=given[1][0],
            code="conflicting_parameters",
        )
    return _spec(*given[0], additional_properties)


# The sources that constrain a text answer and may stand beside `tools`, as on OpenAI.
FORMAT_SOURCES = ("response_format", "text.format")


def _tools_with_format(
    plan: ToolPlan, source: str, fmt: Any, additional_properties: str
) -> ConstraintSpec:
    """The constraint of tools that may be called beside a JSON format for the text answer.

    The format is read and turned into its regex whatever tool_choice is, so a format gclm
    cannot honour is a 400 naming it either way; under "auto" that regex becomes the text
    branch of the tools' regex, while under "required" or a named function the output is a
    call, which the format does not govern.
    """
    text = _spec(source, fmt, additional_properties).constraint
    try:
        text_regex = json_regex(text).regex
    except ConstraintError as e:  # raised here, not cached: its param can be set
        e.param = f"{source}.{'schema' if source == 'text.format' else 'json_schema.schema'}"
        raise
    if plan.mode == "auto":
        plan = replace(plan, text_regex=text_regex)
    return _spec("tools", plan, additional_properties)


def _spec(source: str, value: Any, additional_properties: str) -> ConstraintSpec:
    """The constraint of one source; ConstraintError names the parameter that is wrong."""
    if source == "tools":  # the functions' parameters follow the server's rule too
        plan = replace(value, additional_properties=additional_properties)
        constraint, calls = plan.constraint()
        return ConstraintSpec(constraint, source, True, "graceful", calls)
    body, budget_aware = _READERS[source](value)
    policy = value.budget_policy if isinstance(value, StructuredOutputs) else "graceful"
    nested = source in ("response_format", "structured_outputs", "text.format")
    try:
        constraint = parse_constraint(body, additional_properties=additional_properties)
    except ConstraintError as e:
        inner = e.param or ""
        if source == "text.format":  # read as a response_format; name text.format's own keys
            inner = inner.removeprefix("json_schema.")
        where = f"{source}.{inner}" if nested and inner else source
        raise with_param(e, where) from None
    param = source
    if source == "structured_outputs":
        param += "." + next(k for k in STRUCTURED_KEYS if body.get(k) is not None)
    return ConstraintSpec(constraint, param, budget_aware, policy)


def _read_response_format(fmt: ResponseFormat) -> tuple[dict[str, Any], bool]:
    return fmt.model_dump(by_alias=True, exclude_none=True), True


def _read_text_format(fmt: TextFormat) -> tuple[dict[str, Any], bool]:
    """text.format as the response_format that parse_constraint reads (name, schema and
    strict move under "json_schema")."""
    if fmt.type != "json_schema":
        return {"type": fmt.type}, True
    inner = fmt.model_dump(by_alias=True, exclude_none=True, exclude={"type"})
    return {"type": "json_schema", "json_schema": inner}, True


def _read_structured_outputs(so: StructuredOutputs) -> tuple[dict[str, Any], bool]:
    body = so.model_dump(
        by_alias=True, exclude_none=True, exclude={"budget_aware", "budget_policy", "backend"}
    )
    if so.grammar is not None:
        body["grammar"] = _read_grammar(so.grammar, "structured_outputs.grammar")
    return body, so.budget_aware


def _read_grammar(text: str, param: str) -> str:
    """A grammar as Lark (a GBNF one translated: server/openai/gbnf.py); an error names
    `param`."""
    try:
        return to_lark(text)
    except ConstraintError as e:
        e.param = param
        raise


# Each source as (the dict parse_constraint reads, budget_aware).
_READERS: dict[str, Callable[[Any], tuple[dict[str, Any], bool]]] = {
    "response_format": _read_response_format,
    "structured_outputs": _read_structured_outputs,
    "text.format": _read_text_format,
    "guided_json": lambda v: ({"json": v}, True),
    "guided_regex": lambda v: ({"regex": v}, True),
    "guided_choice": lambda v: ({"choice": v}, True),
    "guided_grammar": lambda v: ({"grammar": _read_grammar(v, "guided_grammar")}, True),
    # A tool plan's constraint is read in `_spec` (server/openai/tools/prompt.py); a function
    # whose parameters cannot compile raises there, naming tools[i].function.parameters.
}


def with_param(exc: ConstraintError, param: str) -> ConstraintError:
    """A copy of `exc` naming `param` (the engine may cache and re-raise one instance)."""
    if exc.param == param:
        return exc
    named = copy.copy(exc)
    named.param = param
    return named


# The header that names the masker a request asked for and gclm replaced with its own.
BACKEND_HEADER = "x-gclm-structured-outputs-backend"


def name_backend(response: Response, body: OpenAIRequest) -> Response:
    """`response`, saying in BACKEND_HEADER which masker served it where the request named
    one (vLLM's `guided_decoding_backend` or `structured_outputs.backend`): gclm's own, as
    `gclm (asked: xgrammar)`."""
    asked = body.decoding_backend
    if asked is not None:
        shown = "".join(c if " " <= c <= "~" else "?" for c in asked[:40])
        response.headers[BACKEND_HEADER] = f"gclm (asked: {shown})"
    return response
