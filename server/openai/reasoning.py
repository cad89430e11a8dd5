"""Reasoning models on the OpenAI API: which requests think, how long, and what comes back.

A server started with `--reasoning-parser NAME` serves a model that thinks before it answers
(`<think> ... </think>`, then the answer). For each chat request (and each /v1/responses
one, through its `reasoning` object: `ThinkingControls`) this module decides whether
it thinks (`reasoning_effort`, `chat_template_kwargs.enable_thinking`) and with which cap
(`thinking_token_budget`, the effort's share), as a `ThinkingSpec` that the engine's
ReasoningState (masking/reasoning.py) enforces: the answer's constraint applies from the end
marker on, and the thinking never eats the tokens the answer needs.

Efforts are shares of the spare budget, `max_tokens` minus the request's minimum (the end
marker plus the answer's shortest output): `low` 1/4, `medium` 1/2, `high` all of it (the
default); `none` (and `enable_thinking: false`) renders the prompt with
`enable_thinking=False` and the request does not think at all. `thinking_token_budget`
caps the thinking tokens (the end marker not counted) below that.

What comes back: `message.reasoning` (and `reasoning_content`, its older name) beside the
answer in `content`; stream deltas of each; `usage.completion_tokens_details.
reasoning_tokens`. `include_reasoning: false` leaves the thinking text out. On
/v1/responses, a `reasoning` output item (responses/render.py). Chat's bodies:
chat/render.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args, runtime_checkable

from pydantic import BaseModel, Field, StrictBool

from gclm.compiler import CompiledTable
from gclm.errors import InvalidRequestError
from gclm.masking.reasoning import ThinkingSpec
from gclm.server.openai.json_values import OptionalJsonInt

# vLLM's parser names, and the markers their models think between.
PARSERS: dict[str, tuple[str, str]] = {
    "deepseek_r1": ("<think>", "</think>"),
    "qwen3": ("<think>", "</think>"),
}
# Share of the spare budget each effort may think for (see the module docstring).
EFFORT_SHARES: dict[str, float] = {"minimal": 0.1, "low": 0.25, "medium": 0.5, "high": 1.0}
Effort = Literal["none", "minimal", "low", "medium", "high"]
EFFORTS: tuple[str, ...] = get_args(Effort)


@runtime_checkable
class ThinkingControls(Protocol):
    """What a request body says about thinking: chat's ReasoningFields, and the Responses
    API's `reasoning` object (responses/protocol.py)."""

    @property
    def reasoning_effort(self) -> str | None: ...

    @property
    def thinking_token_budget(self) -> int | None: ...

    @property
    def include_reasoning(self) -> bool: ...

    def template_kwargs(self) -> dict[str, Any]: ...

    def wants_thinking(self) -> bool: ...


class ReasoningFields(BaseModel):
    """The chat request's reasoning controls (vLLM's names)."""

    reasoning_effort: Effort | None = None
    thinking_token_budget: OptionalJsonInt = Field(default=None, ge=0, strict=True)
    include_reasoning: StrictBool = True
    chat_template_kwargs: dict[str, Any] | None = None

    def template_kwargs(self) -> dict[str, Any]:
        """What the chat template is rendered with: the request's kwargs, and
        `enable_thinking=False` for `reasoning_effort: "none"`."""
        kwargs = dict(self.chat_template_kwargs or {})
        if self.reasoning_effort == "none":
            kwargs["enable_thinking"] = False
        return kwargs

    def wants_thinking(self) -> bool:
        return self.template_kwargs().get("enable_thinking", True) is not False


@dataclass(frozen=True)
class ReasoningParser:
    """The served model's thinking markers, as text and as its token ids."""

    name: str
    start: str
    end: str
    end_ids: tuple[int, ...]

    @classmethod
    def named(cls, name: str, tokenizer: Any) -> ReasoningParser:
        """The parser `name` (PARSERS) for a Hugging Face tokenizer.

        Raises ValueError for an unknown name or a marker the tokenizer cannot spell.
        """
        if name not in PARSERS:
            raise ValueError(
                f"Unknown reasoning parser {name!r}; use one of {', '.join(sorted(PARSERS))}."
            )
        start, end = PARSERS[name]
        end_ids = tuple(tokenizer.encode(end, add_special_tokens=False))
        if not end_ids or tokenizer.decode(list(end_ids)) != end:
            raise ValueError(f"The tokenizer does not spell the end marker {end!r} back.")
        return cls(name, start, end, end_ids)

    def thinking(
        self, body: ThinkingControls, table: CompiledTable | None, max_tokens: int
    ) -> ThinkingSpec | None:
        """How the request thinks (None: it does not): its cap from thinking_token_budget
        and reasoning_effort's share of the spare budget."""
        if not body.wants_thinking():
            return None
        caps = []
        if body.thinking_token_budget is not None:
            caps.append(body.thinking_token_budget)
        if body.reasoning_effort in EFFORT_SHARES:
            answer = table.min_tokens if table is not None else 0
            spare = max(0, max_tokens - len(self.end_ids) - answer)
            caps.append(int(spare * EFFORT_SHARES[body.reasoning_effort]))
        return ThinkingSpec(self.end_ids, cap=min(caps) if caps else None)

    def strip_start(self, text: str) -> str:
        """The thinking text without the start marker the model may have written itself."""
        head = text.lstrip()
        return head[len(self.start) :] if head.startswith(self.start) else text


def reasoning_schema(parser: ReasoningParser | None) -> dict[str, dict[str, Any]]:
    """The thinking controls this server accepts (`check_reasoning`, and the Responses
    `reasoning` object's checks), for the OpenAPI document."""
    falsy: list[Any] = [None, "", 0, False, {}, []]  # an empty value means "not set"
    efforts = [*EFFORTS] if parser is not None else ["none"]
    responses = {
        "anyOf": [
            {"type": "null"},
            {
                "type": "object",
                "properties": {"effort": {"enum": [*efforts, *falsy]}, "summary": {}},
                "additionalProperties": {"enum": falsy},
            },
        ]
    }
    if parser is not None:
        return {"reasoning": responses}
    return {
        "reasoning_effort": {"enum": [None, "none"]},
        "thinking_token_budget": {"type": "null"},
        "reasoning": responses,
    }


def check_reasoning(
    body: ThinkingControls, parser: ReasoningParser | None, param: str | None = None
) -> None:
    """Refuse thinking controls on a server that serves no reasoning model (the 400 names
    `param`, else the control the body set)."""
    if parser is not None:
        return
    if body.reasoning_effort not in (None, "none") or body.thinking_token_budget is not None:
        param = param or ("reasoning_effort" if body.reasoning_effort else "thinking_token_budget")
        raise InvalidRequestError(
            f"{param} needs a reasoning model: start the server with --reasoning-parser "
            f"({', '.join(sorted(PARSERS))}), or remove {param}.",
            param=param,
            code="unsupported_parameter",
        )
