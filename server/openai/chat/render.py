"""Chat completion bodies, in the shapes the official openai SDK parses: "chat.completion",
"chatcmpl-" ids, role and content deltas, tool calls and a thinking request's reasoning;
logprobs as `{"content": [{token, logprob, bytes, top_logprobs}]}`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, SerializeAsAny

from gclm.server.engine.protocol import TokenLogprob
from gclm.server.openai.output import CallEvent, Delta, Finished, Read
from gclm.server.openai.render import ChoiceOutput, Renderer, TopLogprob, Usage, token_bytes
from gclm.server.openai.tools.calls import Call


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]

    @classmethod
    def of(cls, lp: TokenLogprob) -> ChatTokenLogprob:
        top = [TopLogprob.of(t) for t in lp.top]
        return cls(token=lp.token, logprob=lp.logprob, bytes=token_bytes(lp), top_logprobs=top)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None
    refusal: None = None

    @classmethod
    def of(cls, logprobs: Sequence[TokenLogprob] | None) -> ChatLogprobs | None:
        if logprobs is None:
            return None
        return cls(content=[ChatTokenLogprob.of(lp) for lp in logprobs])


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None  # gclm never refuses; the SDK's parse() reads this field


class ChatChoice(BaseModel):
    index: int
    message: SerializeAsAny[AssistantMessage]  # ToolCallMessage adds tool_calls
    logprobs: ChatLogprobs | None = None
    finish_reason: str


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatChunkChoice(BaseModel):
    index: int
    # {"role": "assistant"} first, then {"content": ...} (or {"tool_calls": [...]}), then {}
    delta: dict[str, Any]
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class Function(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: Function


class Custom(BaseModel):
    name: str
    input: str


class CustomToolCall(BaseModel):
    id: str
    type: Literal["custom"] = "custom"
    custom: Custom


class ToolCallMessage(AssistantMessage):
    content: str | None = None  # type: ignore[assignment]
    tool_calls: list[ToolCall | CustomToolCall]


class ReasoningMessage(AssistantMessage):
    """An assistant message with its thinking (both of vLLM's names)."""

    reasoning: str | None = None
    reasoning_content: str | None = None


class ReasoningToolCallMessage(ToolCallMessage):
    """A tool-call message with the thinking before the calls (both of vLLM's names)."""

    reasoning: str | None = None
    reasoning_content: str | None = None


def reasoning_delta(text: str) -> dict[str, str]:
    """A stream delta of thinking text, under both names."""
    return {"reasoning": text, "reasoning_content": text}


class ChatRenderer(Renderer):
    """Chat bodies of any request: what its output parsers read (server/openai/output.py),
    as content, `reasoning` beside it (a thinking request), and `tool_calls` (content null,
    finish_reason "tool_calls"; streamed as `delta.tool_calls` with `index`, the id and name
    first and the arguments after; a custom tool's call as `custom` with its `input`)."""

    id_prefix = "chatcmpl-"

    def _chunk(self, choices: list[ChatChunkChoice], usage: Usage | None = None) -> BaseModel:
        return ChatCompletionChunk(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )

    def opening(self, n: int) -> list[BaseModel]:
        # Where calls may come, no content yet: it stays null when the answer is a call.
        delta = (
            {"role": "assistant"}
            if self.output.tool_calls
            else {"role": "assistant", "content": ""}
        )
        return [self._chunk([ChatChunkChoice(index=i, delta=dict(delta))]) for i in range(n)]

    def reasoning_delta(self, index: int, text: str) -> list[BaseModel]:
        return [self._chunk([ChatChunkChoice(index=index, delta=reasoning_delta(text))])]

    def delta(self, piece: Delta) -> list[BaseModel]:
        delta: dict[str, Any] = {}
        if piece.content or not self.output.tool_calls:
            delta["content"] = piece.content
        if piece.calls:
            delta["tool_calls"] = [_call_delta(e, piece.called[e[1]]) for e in piece.calls]
        if not delta and not piece.logprobs:
            return []  # text a call reader holds back
        logprobs = ChatLogprobs.of(piece.logprobs)
        return [self._chunk([ChatChunkChoice(index=piece.index, delta=delta, logprobs=logprobs)])]

    def finish(self, end: Finished) -> list[BaseModel]:
        chunks: list[BaseModel] = []
        if end.content:
            delta = {"content": end.content}
            chunks.append(self._chunk([ChatChunkChoice(index=end.index, delta=delta)]))
        reason = "tool_calls" if end.calls else end.finish_reason
        chunks.append(
            self._chunk([ChatChunkChoice(index=end.index, delta={}, finish_reason=reason)])
        )
        return chunks

    def closing(self, usage: Usage, include_usage: bool) -> list[BaseModel]:
        return [self._chunk([], usage)] if include_usage else []

    def final(self, outputs: list[ChoiceOutput], usage: Usage) -> BaseModel:
        choices = []
        for i, out in enumerate(outputs):
            choices.append(
                ChatChoice(
                    index=i,
                    message=self.message(out.read, out.calls),
                    logprobs=ChatLogprobs.of(out.logprobs),
                    finish_reason="tool_calls" if out.calls else out.finish_reason,
                )
            )
        return ChatCompletion(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )

    def message(self, read: Read, calls: list[Call]) -> AssistantMessage:
        """One choice's message: its calls (content null) or its text, and a thinking
        request's thinking beside them (null when left out)."""
        tool_calls: list[ToolCall | CustomToolCall] = [
            CustomToolCall(id=c.id, custom=Custom(name=c.name, input=c.arguments))
            if c.custom
            else ToolCall(id=c.id, function=Function(name=c.name, arguments=c.arguments))
            for c in calls
        ]
        if self.output.thinking is None:
            if calls:
                return ToolCallMessage(content=None, tool_calls=tool_calls)
            return AssistantMessage(content=read.content)
        thought = read.reasoning if self.output.include_reasoning else None
        if calls:
            return ReasoningToolCallMessage(
                content=None, tool_calls=tool_calls, reasoning=thought, reasoning_content=thought
            )
        return ReasoningMessage(content=read.content, reasoning=thought, reasoning_content=thought)


def _call_delta(event: CallEvent, call: Call) -> dict[str, Any]:
    """One entry of a streamed `delta.tool_calls`: the id and name first, then arguments
    (a custom tool's call: `custom` with its name, then its `input`)."""
    if call.custom:
        if event[0] == "call":
            return {
                "index": event[1],
                "id": call.id,
                "type": "custom",
                "custom": {"name": call.name, "input": ""},
            }
        return {"index": event[1], "custom": {"input": event[2]}}
    if event[0] == "call":
        return {
            "index": event[1],
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
    return {"index": event[1], "function": {"arguments": event[2]}}
