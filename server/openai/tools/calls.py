"""Tool calling, the response side: the model's output read back as OpenAI tool calls.

The output follows gclm's tool-call format (server/openai/tools/prompt.py), enforced by the
constraint:

    <tool_call>[{"name": "f", "arguments": {...}}, {"name": "g", "arguments": {...}}]

or, under tool_choice "auto", text that does not start with the opener. `CallReader` reads it
character by character as it streams: text goes out as content; a call goes out as its
name (once the name is complete) and then its arguments in fragments, as they arrive.
`ToolChatRenderer` turns that into OpenAI's shapes: `message.tool_calls` (content null,
finish_reason "tool_calls") and streamed `delta.tool_calls` chunks with `index`, the id and
name first and the arguments after.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from gclm.errors import InternalError
from gclm.server.engine.protocol import FinishEvent, TokenLogprob
from gclm.server.openai.render import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatLogprobs,
    ChatRenderer,
    ChoiceOutput,
    Usage,
)
from gclm.server.openai.tools.prompt import OPENER


class Function(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: Function


class ToolCallMessage(AssistantMessage):
    content: str | None = None  # type: ignore[assignment]
    tool_calls: list[ToolCall]


@dataclass
class Call:
    """A call being read: its id and name, and its arguments' text so far."""

    id: str
    name: str = ""
    arguments: str = ""


@dataclass
class CallReader:
    """Reads one choice's output incrementally; `feed` returns what is new.

    `feed(text)` returns (content, events) where content is text for `message.content` and
    each event is ("call", i) when call i's name is complete or ("args", i, fragment).
    The output is valid by construction (the constraint), so the reader only tracks where
    it is; anything else is an InternalError.
    """

    calls: list[Call] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    _state: str = "detect"  # detect, text, open, name_head, name, args_head, args, next, done
    _pending: str = ""  # held back while it may still be the opener or a literal part
    _depth: int = 0
    _in_string: bool = False
    _escaped: bool = False

    def feed(self, text: str) -> tuple[str, list[tuple[Any, ...]]]:
        if self._state == "text":
            self.content.append(text)
            return text, []
        events: list[tuple[Any, ...]] = []
        out_text = ""
        for ch in text:
            if self._state == "detect":
                self._pending += ch
                if self._pending == OPENER:
                    self._state, self._pending = "open", ""
                elif not OPENER.startswith(self._pending):
                    self._state = "text"
                    out_text += self._pending
                    self._pending = ""
            elif self._state == "text":
                out_text += ch
            else:
                self._read_call(ch, events)
        if out_text:
            self.content.append(out_text)
        return out_text, events

    def finish(self) -> str:
        """Text still held back (an output that is a proper prefix of the opener)."""
        rest = self._pending if self._state == "detect" else ""
        self._pending = ""
        if rest:
            self.content.append(rest)
        return rest

    def _literal(self, ch: str, literal: str, then: str) -> None:
        self._pending += ch
        if not literal.startswith(self._pending):
            raise InternalError(f"Tool call output left gclm's format at {self._pending!r}.")
        if self._pending == literal:
            self._state, self._pending = then, ""

    def _read_call(self, ch: str, events: list[tuple[Any, ...]]) -> None:
        state = self._state
        if state == "open":
            self._literal(ch, "[", "name_head")
        elif state == "name_head":
            self._literal(ch, '{"name": "', "name")
            if self._state == "name":
                self.calls.append(Call(id="call_" + secrets.token_hex(12)))
        elif state == "name":
            if ch == '"':  # names are [a-zA-Z0-9_-]: no escapes
                self._state = "args_head"
                events.append(("call", len(self.calls) - 1))
            else:
                self.calls[-1].name += ch
        elif state == "args_head":
            self._literal(ch, ', "arguments": ', "args")
        elif state == "args":
            if self._ends_arguments(ch):
                self._state = "next"
                return
            self.calls[-1].arguments += ch
            if events and events[-1][0] == "args" and events[-1][1] == len(self.calls) - 1:
                events[-1] = ("args", events[-1][1], events[-1][2] + ch)
            else:
                events.append(("args", len(self.calls) - 1, ch))
        elif state == "next":
            self._pending += ch
            if self._pending == "]":
                self._state, self._pending = "done", ""
            elif self._pending == ", ":
                self._state, self._pending = "name_head", ""
            elif self._pending != ",":
                raise InternalError(f"Tool call output left gclm's format at {self._pending!r}.")
        else:
            raise InternalError("Text after the tool calls' closing bracket.")

    def _ends_arguments(self, ch: str) -> bool:
        """Track JSON nesting; True at the '}' that closes the call object."""
        if self._in_string:
            if self._escaped:
                self._escaped = False
            elif ch == "\\":
                self._escaped = True
            elif ch == '"':
                self._in_string = False
            return False
        if ch == '"':
            self._in_string = True
        elif ch in "{[":
            self._depth += 1
        elif ch in "}]":
            if self._depth == 0:
                return True
            self._depth -= 1
        return False


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
        tool_calls = [
            ToolCall(id=c.id, function=Function(name=c.name, arguments=c.arguments)) for c in calls
        ]
        return ToolCallMessage(content=None, tool_calls=tool_calls)


def _call_delta(calls: list[Call], event: tuple[Any, ...]) -> dict[str, Any]:
    """One entry of a streamed `delta.tool_calls`: the id and name first, then arguments."""
    if event[0] == "call":
        call = calls[event[1]]
        return {
            "index": event[1],
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
    return {"index": event[1], "function": {"arguments": event[2]}}
