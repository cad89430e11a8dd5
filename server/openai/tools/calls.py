"""Tool calling, the response side: the model's output read back as OpenAI tool calls.

The output follows gclm's tool-call format (server/openai/tools/prompt.py), enforced by the
constraint:

    <tool_call>[{"name": "f", "arguments": {...}}, {"name": "g", "arguments": {...}}]

or a custom tool's call, its name on the opener's line and its input to the end:

    <tool_call>name
    the input text

or, where a turn may hold several calls and custom tools are among the tools
(`CallFormat.several`), calls one after another, each after its own opener on a new line
(a custom input that could hold that separator runs to the end, and is the last):

    <tool_call>[{"name": "f", "arguments": {...}}]
    <tool_call>name
    the input text
    <tool_call>other
    its input

or, under tool_choice "auto", text that does not start with the opener. `CallReader` reads it
character by character as it streams: text goes out as content; a call goes out as its
name (once the name is complete) and then its arguments in fragments, as they arrive.
Each API writes the calls in its own shapes: chat/render.py (`message.tool_calls`),
responses/function_calls.py (`function_call` items).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from gclm.errors import InternalError
from gclm.server.openai.tools.prompt import OPENER, SEPARATOR, CallFormat


@dataclass
class Call:
    """A call being read: its id and name, and its arguments' text so far."""

    id: str
    name: str = ""
    arguments: str = ""  # a custom call's input
    custom: bool = False


@dataclass
class CallReader:
    """Reads one choice's output incrementally; `feed` returns what is new.

    `feed(text)` returns (content, events) where content is text for `message.content` and
    each event is ("call", i) when call i's name is complete or ("args", i, fragment).
    The output is valid by construction (the constraint), so the reader only tracks where
    it is; anything else is an InternalError.
    """

    format: CallFormat = field(default_factory=CallFormat)
    calls: list[Call] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    # detect, text, open, name_head, name, args_head, args, next, done, after (several:
    # a list's end, then maybe the separator); custom_name, input
    _state: str = "detect"
    _pending: str = ""  # held back while it may still be the opener or a literal part
    _depth: int = 0
    _in_string: bool = False
    _escaped: bool = False

    def feed(self, text: str) -> tuple[str, list[tuple[Any, ...]]]:
        if self._state == "text":
            self.content.append(text)
            return text, []
        if self._state == "input" and text and not self._separated:
            self.calls[-1].arguments += text
            return "", [("args", len(self.calls) - 1, text)]
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

    @property
    def _separated(self) -> bool:
        """Whether the custom call being read ends where the next call's separator starts."""
        return self.format.several and self.calls[-1].name not in self.format.to_end

    def release(self) -> list[tuple[Any, ...]]:
        """At the output's end: the input held back while it might have been a separator."""
        if self._state != "input" or not self._pending:
            return []
        text, self._pending = self._pending, ""
        self.calls[-1].arguments += text
        return [("args", len(self.calls) - 1, text)]

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
        if state == "open" and ch != "[":  # a custom tool's name
            self.calls.append(Call(id="call_" + secrets.token_hex(12), name=ch, custom=True))
            self._state = "custom_name"
        elif state == "custom_name":
            if ch == "\n":
                self._state = "input"
                events.append(("call", len(self.calls) - 1))
            else:
                self.calls[-1].name += ch
        elif state == "input":
            if self._separated:
                ch = self._held_input(ch)
            if ch:
                self._input(ch, events)
        elif state == "open":
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
                self._state, self._pending = "after" if self.format.several else "done", ""
            elif self._pending == ", ":
                self._state, self._pending = "name_head", ""
            elif self._pending != ",":
                raise InternalError(f"Tool call output left gclm's format at {self._pending!r}.")
        elif state == "after":
            self._literal(ch, SEPARATOR, "open")
        else:
            raise InternalError("Text after the tool calls' closing bracket.")

    def _input(self, text: str, events: list[tuple[Any, ...]]) -> None:
        self.calls[-1].arguments += text
        if events and events[-1][0] == "args" and events[-1][1] == len(self.calls) - 1:
            events[-1] = ("args", events[-1][1], events[-1][2] + text)
        else:
            events.append(("args", len(self.calls) - 1, text))

    def _held_input(self, ch: str) -> str:
        """A separated input's next character: the input it releases ("" while what is
        held may still be the separator; at the separator, the next call is read)."""
        self._pending += ch
        if self._pending == SEPARATOR:
            self._state, self._pending = "open", ""
            return ""
        start = 0
        while not SEPARATOR.startswith(self._pending[start:]):
            start += 1
        released, self._pending = self._pending[:start], self._pending[start:]
        return released

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
