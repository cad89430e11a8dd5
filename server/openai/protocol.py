"""The OpenAI wire format of requests to the /v1 endpoints (response bodies: responses.py).

Requests are parsed with `ChatCompletionRequest.parse(body)` / `CompletionRequest.parse(body)`,
which also refuse what gclm cannot honour. The rule: a parameter that does not change the
output (`user`, `metadata`, `store`, ...) is accepted and ignored; a parameter that would
change the output and is not implemented (`functions`, `echo`, `best_of > 1`, and any field
we do not know) is a 400 that names it. It is never dropped silently.

`SamplingFields` holds what every generating endpoint shares (temperature, top_p, seed,
penalties, logit_bias) and turns it into the engine's `SamplingParams`; the Responses API
(`server/openai/responses/protocol.py`) reuses it.

The constraint fields (`response_format`, `structured_outputs`, `guided_*`) are only parsed
here; `server/openai/constraint_spec.py` decides which constraint they ask for.
"""

from __future__ import annotations

import math
from functools import cached_property
from typing import Annotated, Any, ClassVar, Literal, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    StrictBool,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema
from typing_extensions import Self

from gclm.errors import InvalidRequestError, quote
from gclm.server.engine.protocol import SamplingParams
from gclm.server.openai.json_values import JsonInt, OptionalJsonInt, integral
from gclm.server.openai.neutral import FALSY, Neutral
from gclm.server.openai.reasoning import ReasoningFields
from gclm.server.openai.request_rules import (
    FORMAT_NEEDS_SCHEMA,
    TOOL_CHOICE_NEEDS_TOOLS,
    TOP_LOGPROBS_NEEDS_LOGPROBS,
    one_constraint,
    set_,
)
from gclm.server.openai.tools.prompt import (
    NamedToolChoice,
    ToolCallIn,
    ToolChoice,
    ToolDef,
    ToolPlan,
    tool_plan,
)

JsonSchema = dict[str, Any] | StrictBool  # strict: 0 and "true" are not schemas

SEED_MIN, SEED_MAX = -(1 << 63), (1 << 63) - 1

# What the "before" validators below accept, for the OpenAPI document (server/http/openapi.py).
_TEXT = {"type": "string", "minLength": 1}
_TOKENS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
_STOP_SCHEMA = {"anyOf": [_TEXT, {"type": "array", "items": _TEXT}, {"type": "null"}]}
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
_LOGIT_BIAS_SCHEMA = {
    "anyOf": [
        {
            "type": "object",
            # Token ids: ASCII digits only (`$` alone would let Python's re end on a newline).
            "propertyNames": {"pattern": "^[0-9]+$", "not": {"pattern": "\n"}},
            "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
        },
        {"type": "null"},
    ]
}
_NULLABLE_CONTENT_SCHEMA = {"anyOf": [*_CONTENT_SCHEMA["anyOf"], {"type": "null"}]}
_PROMPT_SCHEMA = {
    "anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1},
        _TOKENS,
        {"type": "array", "items": _TOKENS, "minItems": 1},
    ]
}


class _Strict(BaseModel):
    """A nested object whose unknown keys are a 400 (each one could change the output)."""

    model_config = ConfigDict(extra="forbid")


class JsonSchemaFormat(_Strict):
    name: str = "response"
    # "schema" would shadow BaseModel.schema; the alias keeps the wire name.
    schema_: JsonSchema | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None  # gclm always enforces the schema, strict or not
    description: str | None = None


class ResponseFormat(_Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra=FORMAT_NEEDS_SCHEMA)

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Strict):
    """gclm's extension: exactly one of json / regex / choice."""

    model_config = ConfigDict(
        json_schema_extra={"oneOf": [set_(key) for key in ("json", "regex", "choice")]}
    )

    json_: JsonSchema | str | None = Field(default=None, alias="json")
    regex: str | None = Field(default=None, min_length=1)
    choice: list[str] | None = Field(default=None, min_length=1)
    # False: forward-only DFA masking that may run out of budget (for comparisons only).
    budget_aware: StrictBool = True
    # How spare tokens are spent when the budget is tight (masking/graceful.py).
    budget_policy: Literal["graceful", "none"] = "graceful"


class StreamOptions(BaseModel):
    # Other stream options (e.g. include_obfuscation) only shape the transport: ignored.
    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool | None = None


def _nullable(schema: dict[str, Any]) -> None:
    """Document a field whose explicit null means its default (see `_null_is_default`)."""
    inner = {k: schema.pop(k) for k in list(schema) if k not in ("title", "default")}
    schema["anyOf"] = [inner, {"type": "null"}]


class GenerationBody(Protocol):
    """What the shared generation path (app.py) reads from a parsed request, whichever the
    endpoint: chat and text completions (OpenAIRequest) and the Responses API."""

    model: str | None
    stream: bool

    @property
    def n(self) -> int:
        """Choices per prompt (a field, or a class constant of 1 for the Responses API)."""
        ...

    @property
    def include_usage(self) -> bool: ...

    @property
    def logprobs_count(self) -> int | None: ...

    def constraint_sources(self) -> dict[str, Any]:
        """Request field -> the constraint it sets (None where unset); see constraints.py."""
        ...

    def budget_request(self) -> tuple[int | None, str]: ...

    def sampling_params(self, max_tokens: int, sample: int = 0) -> SamplingParams: ...


# OpenAI's ranges (logit_bias values, top_logprobs); vLLM's default max_logprobs is 20 too.
MAX_LOGIT_BIAS = 100.0
MAX_TOP_LOGPROBS = 20
MAX_N = 128  # choices a request may ask for (the queue may hold fewer: --queue-size)


class SamplingFields(BaseModel):
    """The sampling fields every generating endpoint shares, and their SamplingParams.

    Unknown fields land in `model_extra`; `parse` refuses them (and the values listed in
    `_SUPPORTED_ONLY`, documented as their accepted values) with a 400 that names the field.

    Penalties and logit_bias act on the logits before the constraint mask (they can steer a
    constrained output, never break it). `repetition_penalty` is vLLM's extension.
    """

    model_config = ConfigDict(extra="allow")

    # Numbers are strict: "10" and true are not numbers in JSON, and accepting them would hide
    # a client's bug. A float field still takes a JSON integer (1 is 1.0).
    temperature: float = Field(default=1.0, ge=0, le=2, strict=True, json_schema_extra=_nullable)
    top_p: float = Field(default=1.0, ge=0, le=1, strict=True, json_schema_extra=_nullable)
    # A signed 64-bit integer, as OpenAI documents it; torch's generator takes seed + i (i < n
    # <= 128) for every value in this range.
    seed: OptionalJsonInt = Field(default=None, ge=SEED_MIN, le=SEED_MAX, strict=True)
    presence_penalty: float = Field(
        default=0.0, ge=-2, le=2, strict=True, json_schema_extra=_nullable
    )
    frequency_penalty: float = Field(
        default=0.0, ge=-2, le=2, strict=True, json_schema_extra=_nullable
    )
    repetition_penalty: float = Field(
        default=1.0, gt=0, le=2, strict=True, json_schema_extra=_nullable
    )
    # Token id (a JSON key, so a string) -> bias; read into int keys by _bias_range.
    logit_bias: Annotated[
        dict[str, Annotated[float, Field(strict=True)]] | None, WithJsonSchema(_LOGIT_BIAS_SCHEMA)
    ] = None

    # name -> (is the value one gclm can honour?, how to fix the request)
    _SUPPORTED_ONLY: ClassVar[dict[str, Neutral]] = {}

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        # The document names the values `check_supported` accepts, not `Any`.
        schema = handler(core_schema)
        properties = handler.resolve_ref_schema(schema)["properties"]
        for name, neutral in cls._SUPPORTED_ONLY.items():
            properties[name] = neutral.schema()
        return schema

    @classmethod
    def parse(cls, body: bytes) -> Self:
        """Validate a JSON body and refuse unsupported parameters.

        Raises pydantic.ValidationError (malformed) or InvalidRequestError (unsupported).
        """
        request = cls.model_validate_json(body)
        request.check_supported()
        return request

    def check_supported(self) -> None:
        """Raise InvalidRequestError naming the first parameter gclm cannot honour."""
        for name in self.model_extra or {}:
            raise InvalidRequestError(
                f"Unrecognized request argument supplied: {quote(name)}. gclm does not implement "
                "it; remove it from the request.",
                param=name,
                code="unknown_parameter",
            )
        for name, neutral in self._SUPPORTED_ONLY.items():
            value = getattr(self, name)
            if not neutral.accepts(value):
                raise InvalidRequestError(
                    f"{name}={quote(value)} is not supported by gclm; {neutral.fix}.",
                    param=name,
                    code="unsupported_parameter",
                )

    @field_validator(
        "temperature",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        mode="before",
    )
    @classmethod
    def _null_sampling_default(cls, v: Any, info: Any) -> Any:
        # OpenAI clients send explicit nulls for "use the default".
        if v is None:
            return cls.model_fields[info.field_name].default
        # NaN fails every bound check, and "should be less than or equal to 2" misleads.
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{info.field_name} must be a finite number, got {v}")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _bias_range(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (v or {}).items():
            if not key.isascii() or not key.isdigit():
                raise ValueError(f"key {key!r} is not a token id; use the tokenizer's ids")
            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise ValueError(
                    f"the bias for token {key} is {bias}; use a value in "
                    f"[-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]"
                )
        return v

    @property
    def logprobs_count(self) -> int | None:
        """Top logprobs per token (0: the sampled token's only), or None for no logprobs."""
        return None

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return ()

    def sampling_params(self, max_tokens: int, sample: int = 0) -> SamplingParams:
        """The engine's parameters for sample number `sample` of this request."""
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            # Distinct seeds, so n samples of one prompt differ yet are reproducible.
            seed=None if self.seed is None else self.seed + sample,
            stop=self.stop_strings,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            logit_bias=tuple(sorted((int(k), b) for k, b in (self.logit_bias or {}).items())),
            logprobs=self.logprobs_count,
        )


class OpenAIRequest(SamplingFields):
    """Fields shared by both endpoints. Unknown fields land in `model_extra` and are refused.

    `stop` is passed to the engine in SamplingParams, which honours it for unconstrained
    requests only: a constrained output ends where its constraint lets it end, and cutting
    it at a stop string could leave it invalid.
    """

    model: str | None = None  # None: the served model
    max_tokens: OptionalJsonInt = Field(default=None, ge=1, strict=True)
    max_completion_tokens: OptionalJsonInt = Field(default=None, ge=1, strict=True)
    n: JsonInt = Field(default=1, ge=1, le=MAX_N, strict=True, json_schema_extra=_nullable)
    # unconstrained requests only (see the class docstring)
    stop: Annotated[tuple[str, ...], WithJsonSchema(_STOP_SCHEMA)] = ()
    stream: StrictBool = Field(default=False, json_schema_extra=_nullable)
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: JsonSchema | str | None = None
    guided_regex: str | None = Field(default=None, min_length=1)
    guided_choice: list[str] | None = Field(default=None, min_length=1)

    # Accepted and ignored: none of these changes the generated text.
    user: Any = None
    metadata: Any = None
    store: Any = None
    service_tier: Any = None
    prompt_cache_key: Any = None
    prompt_cache_options: Any = None
    prompt_cache_retention: Any = None
    safety_identifier: Any = None

    @field_validator("n", "stream", mode="before")
    @classmethod
    def _null_is_default(cls, v: Any, info: Any) -> Any:
        # OpenAI clients send explicit nulls for "use the default".
        if v is None:
            return cls.model_fields[info.field_name].default
        return v

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list(cls, v: Any) -> Any:
        if v is None:
            return ()
        items = [v] if isinstance(v, str) else v
        if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
            raise ValueError("stop must be a non-empty string or a list of non-empty strings")
        return tuple(items)

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return self.stop

    def constraint_sources(self) -> dict[str, Any]:
        fmt = self.response_format
        return {
            "response_format": fmt if fmt is not None and fmt.type != "text" else None,
            "structured_outputs": self.structured_outputs,
            "guided_json": self.guided_json,
            "guided_regex": self.guided_regex,
            "guided_choice": self.guided_choice,
        }

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def budget_request(self) -> tuple[int | None, str]:
        """(the budget the user set or None, the parameter to name in budget errors)."""
        mt, mct = self.max_tokens, self.max_completion_tokens
        if mt is not None and mct is not None and mt != mct:
            raise InvalidRequestError(
                f"max_tokens={mt} and max_completion_tokens={mct} disagree; set only one.",
                param="max_completion_tokens",
                code="conflicting_parameters",
            )
        if mt is None and mct is not None:
            return mct, "max_completion_tokens"
        return mt, "max_tokens"


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
            try:
                return NamedToolChoice.model_validate(v)
            except ValidationError:
                pass
        raise ValueError(
            'use "none", "auto", "required" or {"type": "function", "function": {"name": ...}}'
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
