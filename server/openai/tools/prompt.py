"""Tool calling, the request side: `tools`, `tool_choice`, the prompt, and the constraint.

gclm's tool-call format (one format for every model, written in the prompt and enforced by
the constraint; a template that renders tools may describe its own layout beside it, but
the output is always this one):

    <tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]

the opener `<tool_call>`, then a JSON array of calls, each `{"name": ..., "arguments": ...}`
with exactly that layout, whose arguments match that function's `parameters` schema. One
call only when `tool_choice` names a function or `parallel_tool_calls` is false; one or more
otherwise.

A custom tool (`{"type": "custom", "custom": {"name", "format"}}`) takes free text, not JSON:

    <tool_call>name
    the input, in the tool's grammar (Lark or regex) or any text, to the end of the output

The name follows the opener on its own line (a function call's list starts with `[`, which
no name does). Where a turn may hold several calls (parallel calls, custom tools among the
tools: `ToolPlan.several`), calls follow one another, each after its own opener on a new
line (SEPARATOR), the function calls' list among them:

    <tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]
    <tool_call>name
    the input
    <tool_call>other
    its input

A free-text input then never holds the separator; an input whose grammar can write it
(decided on the grammar itself: compiler/grown/substrings.py) runs to the end of the output,
as every custom input does where a turn holds one call. A custom tool's Lark grammar whose
rules recurse is called from the constraint rather than unrolled (Constraint.calls): the
server's pushdown masks serve it with no depth cap.

Which constraint `tool_choice` asks for (see `ToolPlan.regex`); an `allowed_tools` choice is
"auto" or "required" over the tools it allows (all the tools are still listed in the prompt,
its rule names the allowed ones):
- "required" / named: the whole output is opener + calls. It compiles into one token DFA with
  a distance vector, so the budget guarantee holds for calls: complete within max_tokens, or
  a 400 naming the minimum.
- "auto": ONE regex, `text that does not start with the opener | opener + calls`. Text states
  accept at any length, so free text is never cut short by the constraint; the states inside
  the opener and the call are at a distance from acceptance, so the budget-aware mask lets
  the model finish the opener only while the tokens left can still complete a valid call.
  With too small a budget the model answers in text, never with a cut-off call.
- "none" (or no tools): no call; the tools are still described in the prompt.

With `response_format` (chat) or `text.format` (Responses) beside the tools, the format
governs the text answer, as on OpenAI: under "auto" the text branch is that JSON's regex
instead of any text (JSON never starts with the opener's `<`); under "required" or a named
function the output is a call, so the format has nothing to govern; under "none" the format
is the whole constraint (server/openai/constraint_spec.py).

The model's own chat template renders the messages. Where it writes tools itself
(`Engine.renders_tools`: it reads `tools` and renders calls or role "tool"), it gets them as
they are: the tools as `tools=`, earlier calls as assistant `tool_calls` (arguments as
objects), results as role "tool" messages, all in the layout the model was trained on; a
short system block then states gclm's call format, the one the constraint enforces, and the
tool_choice rule. Otherwise (the fallback) gclm writes all of it into the messages in its
format: a system block listing the tools, calls as assistant content, results as user
`<tool_response>` messages, so every model and every engine can call tools.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator
from typing_extensions import Self

from gclm.compiler import (
    Constraint,
    SchemaLimits,
    call_char,
    check_regex,
    escape_literal,
    grammar_holds,
    grammar_regex,
    matches_empty,
    normalize_schema,
    recursive_rules,
    schema_regex,
    strip_anchors,
)
from gclm.errors import ConstraintError, InvalidRequestError

OPENER = "<tool_call>"
# Between two calls of one turn (ToolPlan.several): each call after its own opener.
SEPARATOR = "\n" + OPENER
# What OpenAI accepts as a function name; it also keeps names literal in the regex.
NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
# Every tool's parameters share one automaton, without json_regex's fallback to shallower
# free-form objects when they make the regex too long: keep them one level deep here.
TOOL_LIMITS = SchemaLimits(free_object_depth=SchemaLimits().any_depth)
# A function without `parameters` takes none (OpenAI's reading).
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _field_of_type(kinds: tuple[str, ...], exclusive: bool) -> dict[str, Any]:
    """For the OpenAPI document: the object's `type` names the field it must carry (and,
    `exclusive`, the other kinds' fields are left out), as the validators check."""
    branches = []
    for k in kinds:
        props: dict[str, Any] = {"type": {"const": k}, k: {"type": "object"}}
        if exclusive:
            props |= {other: {"type": "null"} for other in kinds if other != k}
        branches.append({"properties": props, "required": ["type", k]})
    return {"anyOf": branches}


_FUNCTION_OR_CUSTOM = ("function", "custom")


class FunctionDef(_Strict):
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None  # gclm always enforces the parameters, strict or not


class Grammar(_Strict):
    syntax: Literal["lark", "regex"]
    definition: str = Field(min_length=1)


class CustomFormat(_Strict):
    """A custom tool's input: free text, or text in a grammar."""

    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {
                    "properties": {"type": {"const": "grammar"}, "grammar": {"type": "object"}},
                    "required": ["grammar"],
                },
                {"properties": {"type": {"const": "text"}, "grammar": {"type": "null"}}},
            ]
        }
    )

    type: Literal["text", "grammar"]
    grammar: Grammar | None = None

    @model_validator(mode="after")
    def _grammar_when_grammar(self) -> Self:
        if (self.type == "grammar") != (self.grammar is not None):
            raise ValueError('a format of type "grammar" needs "grammar": {"syntax", "definition"}')
        return self


class CustomDef(_Strict):
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    format: CustomFormat | None = None  # None: free text

    def input_regex(self, param: str, several: bool = False) -> CustomInput:
        """This tool's input (not anchored): any text without a grammar; `several`: the
        input is followed by another call when it cannot hold SEPARATOR (free text then
        never does), else it runs to the end of the output.

        Raises ConstraintError naming `param` when the grammar cannot be compiled.
        """
        if self.format is None or self.format.grammar is None:
            return CustomInput(without_separator() if several else r"[\s\S]*", several)
        grammar = self.format.grammar
        try:
            if grammar.syntax == "lark":
                Constraint.grammar(grammar.definition)  # reads it: errors name the line
                regex = grammar_regex(grammar.definition).regex
                calls = bool(recursive_rules(grammar.definition))
            else:
                regex = check_regex(strip_anchors(grammar.definition))
                if matches_empty(regex):
                    raise ConstraintError(
                        "The regex matches the empty string; require at least one character."
                    )
                calls = False
        except ConstraintError as e:
            raise ConstraintError(
                f"The grammar of custom tool {self.name!r} cannot be compiled: {e.message}",
                param=param,
                code=e.code,
            ) from None
        text = grammar.definition if grammar.syntax == "lark" else regex
        followed = several and not grammar_holds(text, grammar.syntax, SEPARATOR)
        return CustomInput(regex, followed, grammar.definition if calls else None)


@dataclass(frozen=True)
class CustomInput:
    """A custom tool's input as the tool call's regex writes it: `regex` (unrolled), whether
    another call may follow it, and the Lark grammar it calls where its rules recurse (the
    pushdown masks serve it with no depth cap)."""

    regex: str
    followed: bool
    grammar: str | None = None


class ToolDef(_Strict):
    """A function tool (`function`) or a custom tool (`custom`)."""

    model_config = ConfigDict(json_schema_extra=_field_of_type(_FUNCTION_OR_CUSTOM, True))

    type: Literal["function", "custom"]
    function: FunctionDef | None = None
    custom: CustomDef | None = None

    @model_validator(mode="after")
    def _one_definition(self) -> Self:
        if (self.function is None) == (self.custom is None) or (
            (self.type == "function") != (self.function is not None)
        ):
            raise ValueError(
                f'a tool of type "{self.type}" needs "{self.type}": {{"name": ...}} and no other'
            )
        return self

    @property
    def name(self) -> str:
        return self.function.name if self.function is not None else self.custom.name  # type: ignore[union-attr]


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    """tool_choice naming one tool: {"type": "function", "function": {"name"}} or
    {"type": "custom", "custom": {"name"}}."""

    model_config = ConfigDict(json_schema_extra=_field_of_type(_FUNCTION_OR_CUSTOM, False))

    type: Literal["function", "custom"]
    function: FunctionName | None = None
    custom: FunctionName | None = None

    @model_validator(mode="after")
    def _named(self) -> Self:
        if getattr(self, self.type) is None:
            raise ValueError(f'tool_choice of type "{self.type}" needs "{self.type}": {{"name"}}')
        return self

    @property
    def name(self) -> str:
        return str(getattr(self, self.type).name)


class AllowedToolsSpec(_Strict):
    """chat's `allowed_tools`: a mode and the tools that may be called, each as
    {"type": "function", "function": {"name"}} or {"type": "custom", "custom": {"name"}}
    (the Responses API's flat {"type": "function", "name"} too)."""

    mode: Literal["auto", "required"]
    tools: list[dict[str, Any]] = Field(min_length=1)

    def names(self, param: str) -> tuple[tuple[str, str], ...]:
        """(type, name) of each allowed tool; InvalidRequestError naming `param`.tools[i]
        for an entry without a name."""
        out = []
        for i, tool in enumerate(self.tools):
            kind = tool.get("type")
            inner = tool.get(kind) if isinstance(kind, str) else None
            name = inner.get("name") if isinstance(inner, dict) else tool.get("name")
            if kind not in ("function", "custom") or not isinstance(name, str):
                raise InvalidRequestError(
                    'Each allowed tool is {"type": "function", "function": {"name": ...}} or '
                    '{"type": "custom", "custom": {"name": ...}}, naming one of tools.',
                    param=f"{param}.tools[{i}]",
                )
            out.append((kind, name))
        return tuple(out)


class AllowedToolsChoice(_Strict):
    """tool_choice {"type": "allowed_tools", "allowed_tools": {"mode", "tools"}}: calls may
    use only the tools named ("required": one call at least; "auto": text too)."""

    type: Literal["allowed_tools"]
    allowed_tools: AllowedToolsSpec


@dataclass(frozen=True)
class AllowedTools:
    """An allowed_tools tool_choice, as either API writes it: `mode` over the (type, name)
    pairs `tools`; `param` is where in the request its `tools` list is, for errors."""

    mode: str
    tools: tuple[tuple[str, str], ...]
    param: str


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolsChoice


class CalledFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class CalledCustom(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    input: str


class ToolCallIn(BaseModel):
    """An earlier assistant message's tool call, in the conversation history."""

    model_config = ConfigDict(
        extra="ignore", json_schema_extra=_field_of_type(_FUNCTION_OR_CUSTOM, False)
    )
    id: str | None = None
    type: Literal["function", "custom"] = "function"
    function: CalledFunction | None = None
    custom: CalledCustom | None = None

    @model_validator(mode="after")
    def _called(self) -> Self:
        if getattr(self, self.type) is None:
            raise ValueError(f'a tool call of type "{self.type}" needs "{self.type}"')
        return self


@dataclass(frozen=True)
class ToolPlan:
    """What a request's tools ask of the output: which functions, one call or several.

    `mode` is "auto", "required" or "none"; a named tool_choice is "required" over that one
    function with a single call.
    """

    tools: tuple[FunctionDef, ...]
    mode: str
    parallel: bool
    # Where function i's parameters are in the request, for errors ("{i}" is filled in).
    parameters_param: str = "tools[{i}].function.parameters"
    max_calls: int | None = None  # at most this many calls (Responses' max_tool_calls)
    # Under "auto", the regex a text answer must match (a JSON format's, not anchored; see
    # the module docstring); None: any text that does not start with the opener.
    text_regex: str | None = None
    # Custom tools (free-text input); `custom_param` is where custom tool i's grammar is.
    customs: tuple[CustomDef, ...] = ()
    custom_param: str = "tools[{i}].custom.format.grammar"
    # Where each function, then each custom tool, is in `tools` (None: in that order).
    index: tuple[int, ...] | None = None
    # What a function's object without additionalProperties takes (compiler/front/constraint.py's
    # ADDITIONAL_PROPERTIES): the server's --additional-properties.
    additional_properties: str = "declared"
    # An allowed_tools tool_choice: the names that may be called, a subset of the tools
    # listed in the prompt (None: every tool listed may be called).
    allowed: tuple[str, ...] | None = None

    @property
    def calls_allowed(self) -> bool:
        return self.mode != "none"

    @property
    def several(self) -> bool:
        """Whether a turn may hold several calls, each after its own opener on a new line:
        parallel calls where custom tools are among the tools (functions alone go in one
        list)."""
        return self.parallel and bool(self.customs) and self.max_calls != 1

    def regex(self) -> str:
        """The constraint's regex, every custom grammar unrolled (see `constraint`)."""
        return self.constraint()[0].spec

    def constraint(self) -> tuple[Constraint, CallFormat]:
        """The constraint (see the module docstring), and how its calls read back.

        A custom tool's Lark grammar whose rules recurse is called from the regex
        (Constraint.calls), so that the server's pushdown masks serve it with no depth cap;
        the regex itself has it unrolled, for every other path.

        Raises ConstraintError naming `tools[i].function.parameters` (with the JSON pointer
        in the message) when a function's schema cannot be compiled, or the custom tool's
        grammar when that cannot.
        """
        index = self.index or tuple(range(len(self.tools) + len(self.customs)))
        several = self.several
        # Each call a turn may hold, as (regex, pattern with its grammar called).
        followed: list[tuple[str, str]] = []
        last: list[tuple[str, str]] = []
        to_end: list[str] = []
        grammars: list[str] = []
        if self.tools:
            array = calls_regex(
                self.tools,
                self.parallel,
                self.parameters_param,
                1 if several and self.max_calls is not None else self.max_calls,
                index,
                self.additional_properties,
            )
            followed.append((array, array))
        for i, c in enumerate(self.customs):
            name = escape_literal(f"{c.name}\n")
            inp = c.input_regex(self.custom_param.format(i=index[len(self.tools) + i]), several)
            item = f"{name}(?:{inp.regex})"
            written = item
            if inp.grammar is not None:
                grammars.append(inp.grammar)
                written = name + call_char(len(grammars))
            (followed if inp.followed else last).append((item, written))
            if not inp.followed:
                to_end.append(c.name)
        regex, pattern = (
            self._written([f[k] for f in followed], [c[k] for c in last]) for k in (0, 1)
        )
        calls_format = CallFormat(several, frozenset(to_end))
        if grammars:
            return Constraint(
                "regex", regex, calls=tuple(grammars), calls_pattern=pattern
            ), calls_format
        return Constraint.regex(regex), calls_format

    def _written(self, followed: list[str], last: list[str]) -> str:
        """The whole regex of these calls: under `several`, calls that another may follow,
        SEPARATOR between them, then maybe one that runs to the end (at most max_calls
        calls); else one call of any of them."""
        if not self.several or not followed:
            calls = _one_of(followed + last)
        else:
            more = "*" if self.max_calls is None else f"{{0,{self.max_calls - 1}}}"
            sep = escape_literal(SEPARATOR)
            calls = f"(?:{_one_of(followed)}{sep}){more}{_one_of(followed + last)}"
        if self.mode == "required":
            return escape_literal(OPENER) + calls
        text = f"(?:{self.text_regex})" if self.text_regex else not_starting_with(OPENER)
        return f"{text}|{escape_literal(OPENER)}{calls}"


@dataclass(frozen=True)
class CallFormat:
    """How a turn's calls are written, for their reader (calls.py): `several` calls, each
    after its own opener on a new line, or one; the custom tools whose input runs to the
    end of the output (under `several`, those whose grammar could write SEPARATOR)."""

    several: bool = False
    to_end: frozenset[str] = frozenset()


def _one_of(items: list[str]) -> str:
    return items[0] if len(items) == 1 else "(?:" + "|".join(items) + ")"


def tool_plan(
    tools: list[ToolDef] | None, choice: ToolChoice | None, parallel: bool | None
) -> ToolPlan | None:
    """The plan of a chat request, or None when it has no tools.

    Raises InvalidRequestError for a tool_choice that cannot be honoured: "required" or a
    named function without tools, a name that is not among the tools, or duplicate names.
    """
    if not tools:
        named = (NamedToolChoice, AllowedToolsChoice, AllowedTools)
        if isinstance(choice, named) or choice == "required":
            raise InvalidRequestError(
                "tool_choice needs tools: add the functions to `tools`, or remove tool_choice.",
                param="tool_choice",
            )
        return None
    names = [t.name for t in tools]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise InvalidRequestError(
                f"Two tools are named {name!r}; give every tool a distinct name.",
                param=f"tools[{i}].{tools[i].type}.name",
                code="duplicate_tool_name",
            )
    # Where each kind's i-th tool is in `tools`, for errors.
    functions = tuple(t.function for t in tools if t.function is not None)
    customs = tuple(t.custom for t in tools if t.custom is not None)
    where = _positions(tools)
    if isinstance(choice, NamedToolChoice):
        name = choice.name
        kind = choice.type
        if name not in names or tools[names.index(name)].type != kind:
            raise InvalidRequestError(
                f"tool_choice names the {kind} tool {name[:64]!r}, which is not in tools "
                f"({', '.join(names[:10])}{', ...' if len(names) > 10 else ''}).",
                param=f"tool_choice.{kind}.name",
                code="unknown_tool",
            )
        i = names.index(name)
        if kind == "custom":
            return ToolPlan((), "required", False, customs=(customs[where[i]],), index=(i,))
        return ToolPlan((functions[where[i]],), "required", False, index=(i,))
    if isinstance(choice, AllowedToolsChoice):
        spec = choice.allowed_tools
        where = "tool_choice.allowed_tools"
        choice = AllowedTools(spec.mode, spec.names(where), where)
    if isinstance(choice, AllowedTools):
        return _allowed_plan(tools, choice, parallel)
    mode = choice or "auto"
    return ToolPlan(
        functions,
        mode,
        parallel=parallel is not False,
        customs=customs,
        index=_index(tools, "function") + _index(tools, "custom"),
    )


def _allowed_plan(tools: list[ToolDef], allowed: AllowedTools, parallel: bool | None) -> ToolPlan:
    """The plan of an allowed_tools choice: the constraint over the allowed tools only, every
    tool still described in the prompt.

    Raises InvalidRequestError naming an allowed tool that is not among the tools.
    """
    listed = [(t.type, t.name) for t in tools]
    for i, (kind, name) in enumerate(allowed.tools):
        if (kind, name) not in listed:
            raise InvalidRequestError(
                f"tool_choice allows the {kind} tool {name[:64]!r}, which is not in tools; "
                "allow only tools the request lists.",
                param=f"{allowed.param}.tools[{i}]",
                code="unknown_tool",
            )
    keep = [t for t in tools if (t.type, t.name) in set(allowed.tools)]
    positions = [i for i, t in enumerate(tools) if (t.type, t.name) in set(allowed.tools)]
    functions = tuple(t.function for t in keep if t.function is not None)
    customs = tuple(t.custom for t in keep if t.custom is not None)
    index = tuple(i for i in positions if tools[i].type == "function") + tuple(
        i for i in positions if tools[i].type == "custom"
    )
    return ToolPlan(
        functions,
        allowed.mode,
        parallel=parallel is not False,
        customs=customs,
        index=index,
        allowed=tuple(t.name for t in keep),
    )


def _positions(tools: list[ToolDef]) -> list[int]:
    """Each tool's index among the tools of its type."""
    seen: dict[str, int] = {}
    out = []
    for t in tools:
        out.append(seen.get(t.type, 0))
        seen[t.type] = out[-1] + 1
    return out


def _index(tools: list[ToolDef], kind: str) -> tuple[int, ...]:
    """The index in `tools` of each tool of `kind`."""
    return tuple(i for i, t in enumerate(tools) if t.type == kind)


def calls_regex(
    functions: tuple[FunctionDef, ...],
    parallel: bool,
    parameters_param: str = "tools[{i}].function.parameters",
    max_calls: int | None = None,
    index: tuple[int, ...] | None = None,
    additional_properties: str = "declared",
) -> str:
    """A JSON array of calls (one, or one or more, at most `max_calls`), each in gclm's
    fixed layout. `index`: where each function is in the request's tools (for errors);
    `additional_properties`: normalize_schema's, for every function's parameters."""
    branches = []
    for i, f in enumerate(functions):
        params = f.parameters if f.parameters is not None else NO_PARAMETERS
        try:
            schema, _ = normalize_schema(
                params, TOOL_LIMITS, additional_properties=additional_properties
            )
            args = schema_regex(schema, r"[ ]?")
        except ConstraintError as e:
            raise ConstraintError(
                f"The parameters of function {f.name!r} cannot be compiled: {e.message}",
                param=parameters_param.format(i=index[i] if index else i),
                code=e.code,
            ) from None
        head = escape_literal(f'{{"name": "{f.name}", "arguments": ')
        branches.append(f"{head}(?:{args})\\}}")
    call = "(?:" + "|".join(branches) + ")"
    if not parallel or max_calls == 1:
        more = ""
    else:
        more = f"(?:, {call})" + (f"{{0,{max_calls - 1}}}" if max_calls else "*")
    return f"\\[{call}{more}\\]"


def without_separator() -> str:
    """A regex of every text (the empty one too) that does not hold SEPARATOR: lines, none
    after the first starting with the opener (SEPARATOR is a newline then the opener)."""
    leave, proper = _leaving(OPENER, "\\n")
    return f"[^\\n]*(?:\\n(?:(?:{leave})[^\\n]*|{proper})?)*"


def not_starting_with(prefix: str) -> str:
    """A regex of every non-empty text that does not start with `prefix`.

    Either a proper prefix of `prefix`, or text that leaves it at some character and then
    goes on freely. The free tail is written once: outlines-core's index grows far faster
    than linearly with the number of `[\\s\\S]*` copies in the regex.
    (Non-empty: gclm cannot compile a regex that matches the empty string.)
    """
    leave, proper = _leaving(prefix)
    return f"(?:(?:{leave})[\\s\\S]*|{proper})"


def _leaving(prefix: str, never: str = "") -> tuple[str, str]:
    """Two regexes: the texts that follow `prefix` for a while and then leave it by one
    character (not one of `never`, a class's escaped characters), and the non-empty proper
    prefixes of `prefix`."""
    e = escape_literal
    leave = "|".join(f"{e(prefix[:i])}[^{never}{e(c)}]" for i, c in enumerate(prefix))
    proper = ""
    for c in reversed(prefix[1:-1]):
        proper = e(c) + (f"(?:{proper})?" if proper else "")
    return leave, e(prefix[0]) + (f"(?:{proper})?" if proper else "")


def tools_block(plan: ToolPlan | None, tools: list[ToolDef], native: bool = False) -> str:
    """The system-prompt section that describes the tools and the call format (`native`:
    the format and the rule only, the chat template lists the function tools)."""
    names = [f.name for f in plan.tools] + [c.name for c in plan.customs] if plan else []
    if plan is None or not plan.calls_allowed:
        rule = "Do not call a function now: answer in text."
    elif plan.mode == "required" and len(names) == 1:
        rule = f"Call the {'function' if plan.tools else 'tool'} {names[0]} now."
    elif plan.mode == "required" and plan.allowed is not None:
        rule = f"Call one or more of these now, and no other: {', '.join(names)}."
    elif plan.mode == "required":
        rule = "Call one or more of the functions now."
    elif plan.allowed is not None:
        rule = (
            f"Call one of these when it helps, and no other: {', '.join(names)}; otherwise "
            "answer in text."
        )
    else:
        rule = "Call a function when it helps; otherwise answer in text."
    call_format = (
        f"To call functions, answer with {OPENER} followed by a JSON list of calls and "
        f'nothing else:\n{OPENER}[{{"name": <function name>, "arguments": <arguments '
        "object>}]\n"
    )
    customs = [t for t in tools if t.custom is not None]
    if customs:
        call_format += (
            f"To call a custom tool, answer with {OPENER} followed by the tool's name on its "
            f"own line, then its input as plain text (in the tool's grammar, when it has "
            f"one) and nothing else:\n{OPENER}<tool name>\n<input>\n"
        )
        if plan is not None and plan.several:
            call_format += (
                f"To make several calls, write each after its own {OPENER} on a new line.\n"
            )
    listed = [t for t in tools if not native or t.custom is not None]
    if native and not listed:
        return f"{call_format}{rule}"
    signatures = "\n".join(
        json.dumps(t.model_dump(exclude_none=True), ensure_ascii=False) for t in listed
    )
    if native:
        return f"Custom tools:\n<tools>\n{signatures}\n</tools>\n\n{call_format}{rule}"
    return (
        "# Tools\n\nYou can call these tools (functions with JSON Schema signatures, custom "
        f"tools with free-text input):\n<tools>\n{signatures}\n</tools>\n\n{call_format}"
        f"Tool results come back as <tool_response>...</tool_response>. {rule}"
    )


def template_tools(
    tools: list[ToolDef] | None, native: bool, kwargs: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The chat template's keyword arguments: `kwargs` (the request's own), plus `tools`
    (OpenAI's shape, which transformers passes on as is) for a template that renders them.

    Raises InvalidRequestError when `kwargs` sets `tools` too.
    """
    out = dict(kwargs or {})
    if not native or not tools:
        return out
    if "tools" in out:
        raise InvalidRequestError(
            "chat_template_kwargs.tools and tools both give the chat template its tools; "
            "send the functions in `tools` only.",
            param="chat_template_kwargs.tools",
            code="conflicting_parameters",
        )
    functions = [t.model_dump(exclude_none=True) for t in tools if t.function is not None]
    return {**out, "tools": functions} if functions else out


def call_text(calls: list[ToolCallIn]) -> str:
    """An earlier turn's calls, written as the model would have written them (function
    calls as one list, each custom call after its own opener)."""
    functions = [c for c in calls if c.function is not None]
    parts = []
    if functions:
        items = [{"name": c.function.name, "arguments": _arguments(c)} for c in functions]  # type: ignore[union-attr]
        parts.append(OPENER + json.dumps(items, ensure_ascii=False))
    parts += [f"{OPENER}{c.custom.name}\n{c.custom.input}" for c in calls if c.custom is not None]
    return "\n".join(parts)


def template_calls(calls: list[ToolCallIn]) -> list[dict[str, Any]]:
    """An earlier turn's function calls for a template that renders them: arguments as an
    object (what templates write with `tojson`), as transformers' chat templates expect."""
    return [
        {
            "id": c.id,
            "type": "function",
            "function": {"name": c.function.name, "arguments": _arguments(c)},
        }
        for c in calls
        if c.function is not None
    ]


def _arguments(call: ToolCallIn) -> Any:
    if call.function is None:
        return None
    try:
        return json.loads(call.function.arguments)
    except json.JSONDecodeError:
        return call.function.arguments  # kept as text: it is history, not output


def prompt_messages(
    messages: list[dict[str, Any]],
    tools: list[ToolDef] | None,
    plan: ToolPlan | None,
    native: bool = False,
) -> list[dict[str, Any]]:
    """Messages for the chat template, with calls and results written for it.

    `messages` are ChatMessage dumps (role, content, name, tool_calls, tool_call_id).
    `native` (the template renders tools, `Engine.renders_tools`): calls stay assistant
    `tool_calls` and results role "tool" messages, and the tools go to the template through
    `template_tools`. Otherwise they are written in gclm's format: a tool message becomes
    (part of) a user message, since not every template knows role "tool".
    """
    out: list[dict[str, Any]] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            calls = [ToolCallIn.model_validate(c) for c in m["tool_calls"]]
            customs = [c for c in calls if c.custom is not None]
            if native and len(customs) < len(calls):
                if customs:  # the template knows function calls only: customs as text
                    text = call_text(customs)
                    content = f"{content}\n{text}" if content else text
                out.append(
                    {"role": "assistant", "content": content, "tool_calls": template_calls(calls)}
                )
                continue
            text = call_text(calls)
            out.append({"role": "assistant", "content": f"{content}\n{text}" if content else text})
        elif role == "tool" and native:
            keep = ("role", "name", "tool_call_id")
            result = {k: v for k, v in m.items() if k in keep and v is not None}
            out.append({**result, "content": content})
        elif role == "tool":
            result = f"<tool_response>\n{content}\n</tool_response>"
            if out and out[-1].get("_tool"):
                out[-1]["content"] += "\n" + result
            else:
                out.append({"role": "user", "content": result, "_tool": True})
        else:
            out.append({k: v for k, v in m.items() if k in ("role", "content", "name")})
    for m in out:
        m.pop("_tool", None)
    if tools:
        block = tools_block(plan, tools, native)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{block}"}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out
