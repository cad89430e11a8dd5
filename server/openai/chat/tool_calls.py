"""Chat's tool calls: the output read by `CallReader` (server/openai/tools/calls.py) in
OpenAI's shapes: `message.tool_calls` (content null, finish_reason "tool_calls") and streamed
`delta.tool_calls` chunks with `index`, the id and name first and the arguments after.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel

from gclm.server.engine.protocol import FinishEvent, TokenLogprob
from gclm.server.openai.chat.render import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatLogprobs,
    ChatRenderer,
)
from gclm.server.openai.render import ChoiceOutput, Usage
from gclm.server.openai.tools.calls import Call, CallReader


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


class ToolChatRenderer(ChatRenderer):
    """A chat renderer that reads each choice's output as text or tool calls (used when
    tool_choice allows calls; with "none" the plain ChatRenderer answers)."""

    def __init__(self, model: str) -> None:
        super().__init__(model)
        self._readers: dict[int, CallReader] = {}

    def _reader(self, index: int) -> CallReader:
        if index not in self._readers:
            self._readers[index] = CallReader()
        return self._readers[index]

    def finish_reason(self, event: FinishEvent) -> str:
        # Text under "auto" is free text: a budget cut is "length" (a call is never cut).
        return "length" if event.budget_cut else event.finish_reason

    def opening(self, n: int) -> list[BaseModel]:
        # No content yet: it stays null when the answer is a call.
        return [
            self._chunk([ChatChunkChoice(index=i, delta={"role": "assistant"})]) for i in range(n)
        ]

    def delta(
        self, index: int, text: str, logprobs: Sequence[TokenLogprob] | None
    ) -> BaseModel | None:
        content, events = self._reader(index).feed(text)
        return self._delta_chunk(index, content, events, logprobs)

    def _delta_chunk(
        self,
        index: int,
        content: str,
        events: list[tuple[Any, ...]],
        logprobs: Sequence[TokenLogprob] | None,
    ) -> BaseModel | None:
        delta: dict[str, Any] = {}
        if content:
            delta["content"] = content
        if events:
            calls = self._reader(index).calls
            delta["tool_calls"] = [_call_delta(calls, e) for e in events]
        if not delta and not logprobs:
            return None
        choice = ChatChunkChoice(index=index, delta=delta, logprobs=ChatLogprobs.of(logprobs))
        return self._chunk([choice])

    def finish(self, index: int, finish_reason: str) -> list[BaseModel]:
        reader = self._reader(index)
        chunks: list[BaseModel] = []
        rest = reader.finish()
        if rest:
            chunks.append(self._chunk([ChatChunkChoice(index=index, delta={"content": rest})]))
        reason = "tool_calls" if reader.calls else finish_reason
        chunks.append(self._chunk([ChatChunkChoice(index=index, delta={}, finish_reason=reason)]))
        return chunks

    def final(self, outputs: list[ChoiceOutput], usage: Usage) -> BaseModel:
        choices = []
        for i, out in enumerate(outputs):
            reader = CallReader()
            reader.feed(out.text)
            reader.finish()
            choices.append(
                ChatChoice(
                    index=i,
                    message=self.message(out, reader.calls),
                    logprobs=ChatLogprobs.of(out.logprobs),
                    finish_reason="tool_calls" if reader.calls else out.finish_reason,
                )
            )
        return ChatCompletion(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )

    def message(self, out: ChoiceOutput, calls: list[Call]) -> AssistantMessage:
        """One choice's message: its calls (content null), or its text when it made none."""
        if not calls:
            return AssistantMessage(content=out.text)
        tool_calls: list[ToolCall | CustomToolCall] = [
            CustomToolCall(id=c.id, custom=Custom(name=c.name, input=c.arguments))
            if c.custom
            else ToolCall(id=c.id, function=Function(name=c.name, arguments=c.arguments))
            for c in calls
        ]
        return ToolCallMessage(content=None, tool_calls=tool_calls)


def _call_delta(calls: list[Call], event: tuple[Any, ...]) -> dict[str, Any]:
    """One entry of a streamed `delta.tool_calls`: the id and name first, then arguments."""
    call = calls[event[1]]
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
