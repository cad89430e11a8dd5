"""The Responses API's request: POST /v1/responses, parsed and turned into chat messages.

    body = ResponsesRequest.parse(raw)       # 400 for what gclm cannot honour
    messages = body.messages()               # instructions + input, for the chat template

It shares everything else with chat completions: the sampling fields (`SamplingFields`),
the constraint reader (`text.format`, in constraint_spec.py), the budget check (naming
`max_output_tokens`) and the generation path in serving.py. Its bodies and stream events are
built by `ResponsesRenderer` (responses/render.py).

Function tools (`tools`, `tool_choice`, `parallel_tool_calls`) are chat's tool calling
(server/openai/tools/): the Responses shapes are turned into chat's `ToolDef` and tool_choice,
so the prompt, the constraint and its budget guarantee are the same. Earlier `function_call`
items and `function_call_output` items in `input` (responses/input_items.py) become the
assistant calls and tool results of chat's history.

A reasoning model (`--reasoning-parser`) thinks before it answers, as on chat:
`reasoning.effort` is chat's `reasoning_effort` (`none` turns thinking off; other efforts
cap it at a share of the spare budget, server/openai/reasoning.py), and `max_output_tokens`
covers both the thinking and the answer. `reasoning.summary` is accepted and changes
nothing (the thinking comes back whole, as `reasoning_text` content).

A response is stored unless `store` is false (responses/store.py), and a request naming it
in `previous_response_id` reads after its conversation: the stored input items, then its
output items, then this request's `input` (`continued`). `instructions` and `tools` are this
request's own, as at OpenAI. `conversation` (a Conversations API object), `prompt` (a stored
template) and `background` are a 400.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cached_property
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from typing_extensions import Self

from gclm.errors import InvalidRequestError, cut
from gclm.server.openai.json_values import OptionalJsonInt
from gclm.server.openai.neutral import FALSY, Neutral
from gclm.server.openai.protocol import MAX_TOP_LOGPROBS, SamplingFields, _nullable
from gclm.server.openai.reasoning import EFFORTS
from gclm.server.openai.request_rules import (
    TEXT_FORMAT_NEEDS_SCHEMA,
    TOOL_CHOICE_NEEDS_TOOLS,
)
from gclm.server.openai.responses.input_items import (
    INPUT_ITEMS,
    INPUT_SCHEMA,
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    read_items,
)
from gclm.server.openai.tools.prompt import (
    NAME_PATTERN,
    AllowedTools,
    AllowedToolsSpec,
    CustomDef,
    CustomFormat,
    FunctionDef,
    Grammar,
    NamedToolChoice,
    ToolDef,
    ToolPlan,
    tool_plan,
)

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


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextFormat(_Strict):
    """`text.format`: free text, any JSON object, or a JSON Schema (name, schema and strict
    at the top level, unlike chat's response_format)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=TEXT_FORMAT_NEEDS_SCHEMA)

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


class FunctionTool(_Strict):
    """A function tool, Responses-style: name, description and parameters at the top level
    (chat nests them under "function")."""

    type: Literal["function"]
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None  # gclm always enforces the parameters, strict or not

    def as_chat(self) -> ToolDef:
        function = FunctionDef(
            name=self.name,
            description=self.description,
            parameters=self.parameters,
            strict=self.strict,
        )
        return ToolDef(type="function", function=function)


class CustomToolFormat(_Strict):
    """A custom tool's input, Responses-style: the grammar is flat (chat nests it)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "anyOf": [
                {
                    "properties": {
                        "type": {"const": "grammar"},
                        "syntax": {"enum": ["lark", "regex"]},
                        "definition": {"type": "string", "minLength": 1},
                    },
                    "required": ["syntax", "definition"],
                },
                {
                    "properties": {
                        "type": {"const": "text"},
                        "syntax": {"type": "null"},
                        "definition": {"type": "null"},
                    }
                },
            ]
        },
    )

    type: Literal["text", "grammar"]
    syntax: Literal["lark", "regex"] | None = None
    definition: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _grammar_given(self) -> Self:
        given = (self.syntax is not None, self.definition is not None)
        if given != ((True, True) if self.type == "grammar" else (False, False)):
            raise ValueError(
                'a format of type "grammar" needs "syntax" and "definition"; one of type '
                '"text" has neither'
            )
        return self


class CustomTool(_Strict):
    """A custom tool (free-text input, in a grammar when it has one)."""

    type: Literal["custom"]
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    format: CustomToolFormat | None = None

    def as_chat(self) -> ToolDef:
        fmt = None
        if self.format is not None:
            grammar = None
            if self.format.syntax is not None and self.format.definition is not None:
                grammar = Grammar(syntax=self.format.syntax, definition=self.format.definition)
            fmt = CustomFormat(type=self.format.type, grammar=grammar)
        custom = CustomDef(name=self.name, description=self.description, format=fmt)
        return ToolDef(type="custom", custom=custom)


class CustomChoice(_Strict):
    """tool_choice naming one custom tool: {"type": "custom", "name": ...}."""

    type: Literal["custom"]
    name: str


class FunctionChoice(_Strict):
    """tool_choice naming one function: {"type": "function", "name": ...}."""

    type: Literal["function"]
    name: str


class AllowedChoice(_Strict):
    """tool_choice {"type": "allowed_tools", "mode", "tools": [{"type": "function", "name"},
    ...]}: calls may use only those tools ("required": at least one call; "auto": text too)."""

    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[dict[str, Any]] = Field(min_length=1)

    def as_chat(self) -> AllowedTools:
        names = AllowedToolsSpec(mode=self.mode, tools=self.tools).names("tool_choice")
        return AllowedTools(self.mode, names, "tool_choice")


REASONING_KEYS = ("effort", "summary", "generate_summary")


class ResponsesRequest(SamplingFields):
    """POST /v1/responses. `input` (a string is one user message) becomes a list of messages.

    temperature, top_p, seed, the penalties and logit_bias are SamplingFields' (the last
    four as extensions, as on chat). Unknown fields are refused.
    """

    model_config = ConfigDict(json_schema_extra={"allOf": [TOOL_CHOICE_NEEDS_TOOLS]})

    n: ClassVar[int] = 1  # one output per response

    model: str | None = None
    input: Annotated[list[InputItem], WithJsonSchema(INPUT_SCHEMA)] = Field(min_length=1)
    instructions: str | None = None
    max_output_tokens: OptionalJsonInt = Field(default=None, ge=1, strict=True)
    stream: StrictBool = Field(default=False, json_schema_extra=_nullable)
    text: TextConfig | None = None
    top_logprobs: OptionalJsonInt = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS, strict=True)
    include: list[Include] | None = None

    store: StrictBool | None = None  # None: true, as at OpenAI (see `stores`)
    previous_response_id: str | None = Field(default=None, min_length=1, max_length=256)

    # Accepted and ignored: none of these changes the generated text.
    stream_options: Any = None  # include_obfuscation: transport only
    metadata: Any = None
    user: Any = None
    safety_identifier: Any = None
    service_tier: Any = None
    prompt_cache_key: Any = None
    prompt_cache_retention: Any = None
    tools: list[Annotated[FunctionTool | CustomTool, Field(discriminator="type")]] | None = None
    tool_choice: (
        Literal["none", "auto", "required"] | FunctionChoice | CustomChoice | AllowedChoice | None
    ) = None
    parallel_tool_calls: StrictBool | None = None  # None: true, as at OpenAI
    max_tool_calls: OptionalJsonInt = Field(default=None, ge=1, strict=True)
    truncation: Literal["auto", "disabled"] | None = None  # gclm never truncates: a long
    # input is a 400 naming the context length, never a silently shortened one

    # Accepted only at a value that leaves the output unchanged.
    conversation: Any = None
    prompt: Any = None
    background: Any = None
    reasoning: Any = None

    _SUPPORTED_ONLY: ClassVar[dict[str, Neutral]] = {
        "conversation": Neutral(
            "gclm has no Conversations API; chain turns with previous_response_id, or send "
            "them in `input`"
        ),
        "prompt": Neutral("gclm stores no prompt templates; send the text in `input`"),
        "background": Neutral("remove it or set it to false", FALSY),
    }

    @property
    def stores(self) -> bool:
        """Whether the response is to be stored (`store` unset is true, as at OpenAI; on a
        server with --responses-db off it is not, and only `store: true` is refused)."""
        return self.store is not False

    def continued(self, earlier: list[dict[str, Any]]) -> Self:
        """This request read after `earlier`, a stored conversation's items (its inputs and
        outputs, oldest first): they come before `input` in the prompt."""
        return self.model_copy(update={"input": [*read_items(earlier), *self.input]})

    @field_validator("stream", mode="before")
    @classmethod
    def _null_is_false(cls, v: Any) -> Any:
        return False if v is None else v

    @field_validator("reasoning")
    @classmethod
    def _reasoning(cls, v: Any) -> Any:
        """None or {"effort": ..., "summary": ...}, an empty value meaning unset (clients
        send {"effort": None} for "no options"); a server without a reasoning model refuses
        an effort other than none (server/openai/reasoning.py's `check_reasoning`)."""
        if v is None:
            return v
        if not isinstance(v, dict):
            raise ValueError('must be an object such as {"effort": "low"}')
        given = {key: value for key, value in v.items() if value}
        unknown = sorted(set(given) - set(REASONING_KEYS))
        if unknown:
            keys = ", ".join(REASONING_KEYS)
            raise ValueError(f"has {cut(unknown[0], 80)!r}; its keys are {keys}")
        if "effort" in given and given["effort"] not in EFFORTS:
            got = cut(repr(given["effort"]), 80)
            raise ValueError(f"effort must be one of {', '.join(EFFORTS)}, got {got}")
        return given or None

    # The reasoning controls chat has (server/openai/reasoning.py ThinkingControls).
    @property
    def reasoning_effort(self) -> str | None:
        return self.reasoning.get("effort") if self.reasoning else None

    thinking_token_budget: ClassVar[None] = None  # a cap comes from the effort only
    include_reasoning: ClassVar[bool] = True

    def template_kwargs(self) -> dict[str, Any]:
        """`enable_thinking=False` for `reasoning.effort: "none"`."""
        return {"enable_thinking": False} if self.reasoning_effort == "none" else {}

    def wants_thinking(self) -> bool:
        return self.reasoning_effort != "none"

    @field_validator("input", mode="before")
    @classmethod
    def _known_items(cls, v: Any) -> Any:
        """A string is one user message; an item without a type is a message; name an item
        type gclm does not read (reasoning, web search calls, ...)."""
        if isinstance(v, str):
            return [{"type": "message", "role": "user", "content": v}]
        if isinstance(v, list):
            items = []
            for item in v:
                kind = item.get("type", "message") if isinstance(item, dict) else None
                if kind not in INPUT_ITEMS:
                    raise ValueError(
                        f"input items of type {kind!r} are not supported; gclm accepts "
                        "messages ({'role': ..., 'content': ...}), function_call and "
                        "function_call_output items"
                    )
                items.append({"type": "message", **item} if "type" not in item else item)
            return items
        return v

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools(cls, v: Any) -> Any:
        """Name a tool type other than "function" or "custom" (built-in tools run at OpenAI)."""
        if isinstance(v, list):
            for tool in v:
                kind = tool.get("type") if isinstance(tool, dict) else None
                if kind not in ("function", "custom"):
                    raise ValueError(
                        f"tools of type {kind!r} are not supported; gclm calls function "
                        'tools ({"type": "function", "name": ..., "parameters": ...}) and '
                        'custom tools ({"type": "custom", "name": ..., "format": ...})'
                    )
        return v

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice(cls, v: Any) -> Any:
        # One clear message instead of pydantic's per-union-member errors.
        if v is None or v in ("none", "auto", "required"):
            return v
        if (
            isinstance(v, dict)
            and v.get("type") in ("function", "custom")
            and isinstance(v.get("name"), str)
        ):
            return v
        if isinstance(v, dict) and v.get("type") == "allowed_tools":
            try:
                return AllowedChoice.model_validate(v)
            except ValidationError:
                pass
        raise ValueError(
            'use "none", "auto", "required", {"type": "function", "name": ...}, '
            '{"type": "custom", "name": ...} or {"type": "allowed_tools", "mode": "auto" or '
            '"required", "tools": [{"type": "function", "name": ...}, ...]}'
        )

    def check_supported(self) -> None:
        super().check_supported()
        self.tool_plan  # noqa: B018 (raises InvalidRequestError for a tool_choice it cannot honour)

    @cached_property
    def tool_plan(self) -> ToolPlan | None:
        """What the tools ask of the output (None: no tools), as on chat."""
        choice: Any = self.tool_choice
        if isinstance(choice, AllowedChoice):
            choice = choice.as_chat()
        elif isinstance(choice, FunctionChoice | CustomChoice):
            choice = NamedToolChoice.model_validate(
                {"type": choice.type, choice.type: {"name": choice.name}}
            )
        # Errors name chat's parameters; here they are in the Responses layout (no ".function").
        try:
            plan = tool_plan(self.chat_tools, choice, self.parallel_tool_calls)
        except InvalidRequestError as e:
            e.param = e.param and e.param.replace(".function", "").replace(".custom", "")
            raise
        return plan and replace(
            plan,
            parameters_param="tools[{i}].parameters",
            custom_param="tools[{i}].format",
            max_calls=self.max_tool_calls,
        )

    @property
    def chat_tools(self) -> list[ToolDef] | None:
        return [t.as_chat() for t in self.tools] if self.tools else None

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
        plan = self.tool_plan
        return {
            "text.format": fmt if fmt is not None and fmt.type != "text" else None,
            "tools": plan if plan and plan.calls_allowed else None,
        }

    def budget_request(self) -> tuple[int | None, str]:
        return self.max_output_tokens, "max_output_tokens"

    def messages(self) -> list[dict[str, Any]]:
        """`instructions` as a system message, then `input`, as chat messages: function_call
        items join the assistant turn as its tool_calls, function_call_output items are tool
        messages (server/openai/tools/prompt.py writes both for the chat template)."""
        out: list[dict[str, Any]] = []
        if self.instructions:
            out.append({"role": "system", "content": self.instructions})
        for item in self.input:
            if isinstance(item, FunctionCallItem):
                call = {
                    "id": item.call_id,
                    "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments},
                }
                last = out[-1] if out else None
                if last is not None and last["role"] == "assistant":
                    last.setdefault("tool_calls", []).append(call)
                else:
                    out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif isinstance(item, CustomToolCallItem):
                custom = {
                    "id": item.call_id,
                    "type": "custom",
                    "custom": {"name": item.name, "input": item.input},
                }
                last = out[-1] if out else None
                if last is not None and last["role"] == "assistant":
                    last.setdefault("tool_calls", []).append(custom)
                else:
                    out.append({"role": "assistant", "content": None, "tool_calls": [custom]})
            elif isinstance(item, FunctionCallOutputItem | CustomToolCallOutputItem):
                out.append({"role": "tool", "content": item.output, "tool_call_id": item.call_id})
            else:
                # Chat templates predate "developer", OpenAI's new name for "system".
                role = "system" if item.role == "developer" else item.role
                out.append({"role": role, "content": item.content})
        return out
