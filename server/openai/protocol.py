"""The OpenAI request fields every generating endpoint shares (the APIs' own requests:
chat/protocol.py, completions/protocol.py, responses/protocol.py).

Requests are parsed with `ChatCompletionRequest.parse(body)` / `CompletionRequest.parse(body)`,
which also refuse what gclm cannot honour. The rule: a parameter that does not change the
output (`user`, `metadata`, `store`, ...) is accepted and ignored; a parameter that would
change the output and is not implemented (`functions`, `echo`, `best_of > 1`, and any field
we do not know) is a 400 that names it. It is never dropped silently.

`SamplingFields` holds what every generating endpoint shares (temperature, top_p, seed,
penalties, logit_bias) and turns it into the engine's `SamplingParams`; the Responses API
(`server/openai/responses/protocol.py`) reuses it. `OpenAIRequest` adds what chat and text
completions share.

The constraint fields (`response_format`, `structured_outputs`, `guided_*`) are only parsed
here; `server/openai/constraint_spec.py` decides which constraint they ask for.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    StrictBool,
    WithJsonSchema,
    field_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema
from typing_extensions import Self

from gclm.errors import InvalidRequestError, quote
from gclm.server.engine.protocol import SamplingParams
from gclm.server.openai.json_values import JsonInt, OptionalJsonInt
from gclm.server.openai.neutral import Neutral
from gclm.server.openai.request_rules import FORMAT_NEEDS_SCHEMA, set_

JsonSchema = dict[str, Any] | StrictBool  # strict: 0 and "true" are not schemas

SEED_MIN, SEED_MAX = -(1 << 63), (1 << 63) - 1

# What the "before" validators below accept, for the OpenAPI document (server/http/openapi.py).
_TEXT = {"type": "string", "minLength": 1}
_STOP_SCHEMA = {"anyOf": [_TEXT, {"type": "array", "items": _TEXT}, {"type": "null"}]}
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
    """gclm's extension (vLLM's `structured_outputs`): exactly one of json / regex / choice /
    grammar (Lark syntax, or GBNF)."""

    model_config = ConfigDict(
        json_schema_extra={"oneOf": [set_(key) for key in ("json", "regex", "choice", "grammar")]}
    )

    json_: JsonSchema | str | None = Field(default=None, alias="json")
    regex: str | None = Field(default=None, min_length=1)
    choice: list[str] | None = Field(default=None, min_length=1)
    grammar: str | None = Field(default=None, min_length=1)  # Lark, or GBNF (openai/gbnf.py)
    # vLLM's choice of masker (xgrammar, guidance, outlines, ...): accepted and ignored, as
    # gclm's own masker serves every constraint; the answer's header says so.
    backend: str | None = None
    # False: forward-only DFA masking that may run out of budget (for comparisons only).
    budget_aware: StrictBool = True
    # How spare tokens are spent when the budget is tight (masking/graceful.py).
    budget_policy: Literal["graceful", "none"] = "graceful"
    # vLLM's option, for `json`: true generates an object's declared properties only where
    # its schema leaves additionalProperties unsaid, false accepts other keys after them;
    # unset: the server's --additional-properties.
    disable_additional_properties: StrictBool | None = None


class StreamOptions(BaseModel):
    # Other stream options (e.g. include_obfuscation) only shape the transport: ignored.
    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool | None = None


def _nullable(schema: dict[str, Any]) -> None:
    """Document a field whose explicit null means its default (see `_null_is_default`)."""
    inner = {k: schema.pop(k) for k in list(schema) if k not in ("title", "default")}
    schema["anyOf"] = [inner, {"type": "null"}]


class GenerationBody(Protocol):
    """What the shared generation path (serving.py) reads from a parsed request, whichever the
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
        """Request field -> the constraint it sets (None where unset); see constraint_spec.py."""
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
    guided_grammar: str | None = Field(default=None, min_length=1)  # structured_outputs.grammar
    guided_decoding_backend: str | None = None  # as structured_outputs.backend: ignored

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
            "guided_grammar": self.guided_grammar,
        }

    @property
    def decoding_backend(self) -> str | None:
        """The masker the request named (`guided_decoding_backend`, or
        `structured_outputs.backend`), which gclm's own replaces; None: none named."""
        so = self.structured_outputs
        return self.guided_decoding_backend or (so.backend if so is not None else None)

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
