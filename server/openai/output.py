"""Output parsers: how a choice's text is read back, composed per request.

The plan of a request (serving.py) names what its output holds (`OutputSpec`): plain text; a
thinking request's thinking (`Thinking`: its start marker stripped, or the text left out); an
answer that tools allow to be calls (`ToolCalls`: text or calls, read by tools/calls.py's
`CallReader`). "Reasoning and tool calls" is a list of those two parsers, not a renderer
class. The serving pipeline reads each choice once, through its `ChoiceReader`: a stream piece
by piece (`StreamReader`: a `Delta` per piece of answer, a `Finished` per choice's end), a
collected answer whole (`ChoiceReader.read_all`); each API's renderer (chat/render.py,
completions/render.py, responses/render.py) is handed what was read and writes it in that
API's shapes, without reading anything again.

A new kind of output is one more parser here, added by `OutputSpec.parsers`, and its shape in
the renderers. OpenAI's "custom" tools (free-form or grammar input) are read by `ToolCalls`
too: `CallReader` reads a custom call's name and its `input` (a `Call` with `custom` set),
and each renderer writes it in its API's custom-call shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from gclm.server.engine.protocol import FinishEvent, TokenLogprob
from gclm.server.openai.tools.calls import Call, CallReader
from gclm.server.openai.tools.prompt import CallFormat

if TYPE_CHECKING:
    from gclm.server.openai.reasoning import ReasoningParser

# ("call", i, call) when call i's name is complete; ("args", i, fragment) as arguments arrive.
CallEvent = tuple[Any, ...]


@dataclass
class Read:
    """What a piece of one choice's output reads as: answer text, thinking text, calls."""

    content: str = ""
    reasoning: str = ""
    calls: list[CallEvent] = field(default_factory=list)


class OutputParser(Protocol):
    """One stage of reading a choice's output; a ChoiceReader runs them in order."""

    def feed(self, read: Read) -> Read:
        """What `read` (the previous stage's) reads as after this stage."""
        ...

    def flush(self, read: Read) -> Read:
        """At the choice's end: `read` plus what this stage still holds back."""
        ...

    def finish_reason(self, event: FinishEvent, reason: str) -> str:
        """The finish_reason to report, given the previous stage's `reason`."""
        ...


class Thinking:
    """A thinking request's thinking text: without the start marker the model may write,
    or left out (`include_reasoning: false`)."""

    def __init__(self, parser: ReasoningParser, include: bool) -> None:
        self.parser, self.include = parser, include
        self._started = False

    def feed(self, read: Read) -> Read:
        if read.reasoning:
            text = read.reasoning
            if not self._started:
                self._started = True
                text = self.parser.strip_start(text)
            read.reasoning = text if self.include else ""
        return read

    def flush(self, read: Read) -> Read:
        return read

    def finish_reason(self, event: FinishEvent, reason: str) -> str:
        return reason


class ToolCalls:
    """An answer that is text or tool calls (tool_choice allows calls)."""

    def __init__(self, how: CallFormat) -> None:
        self.reader = CallReader(how)

    def feed(self, read: Read) -> Read:
        if read.content:
            read.content, events = self.reader.feed(read.content)
            calls = self.reader.calls
            read.calls += [(e[0], e[1], calls[e[1]]) if e[0] == "call" else e for e in events]
        return read

    def flush(self, read: Read) -> Read:
        read.calls += self.reader.release()
        read.content += self.reader.finish()
        return read

    def finish_reason(self, event: FinishEvent, reason: str) -> str:
        # Text under "auto" is free text: a budget cut is "length" (a call is never cut).
        return "length" if event.budget_cut else reason


@dataclass(frozen=True)
class OutputSpec:
    """What a request's output holds, decided once in its plan."""

    thinking: ReasoningParser | None = None  # a thinking request's markers
    include_reasoning: bool = True
    tool_calls: bool = False  # tools allow calls
    calls: CallFormat = CallFormat()  # how they are written (the plan's constraint says)

    def parsers(self) -> list[OutputParser]:
        """One choice's parsers, fresh, in the order they read."""
        parsers: list[OutputParser] = []
        if self.thinking is not None:
            parsers.append(Thinking(self.thinking, self.include_reasoning))
        if self.tool_calls:
            parsers.append(ToolCalls(self.calls))
        return parsers

    def reader(self) -> ChoiceReader:
        return ChoiceReader(self.parsers())

    def finish_reason(self, event: FinishEvent) -> str:
        """The finish_reason to report: the engine's, where a constrained output cut by the
        budget is complete, so "stop"; the parsers may say otherwise (free text under tools)."""
        reason = event.finish_reason
        for parser in self.parsers():
            reason = parser.finish_reason(event, reason)
        return reason


PLAIN = OutputSpec()  # plain text: nothing to read back


class ChoiceReader:
    """One choice's output through its parsers, piece by piece; `calls` are the calls read."""

    def __init__(self, parsers: list[OutputParser]) -> None:
        self.parsers = parsers
        self.calls: list[Call] = []

    def feed(self, content: str = "", reasoning: str = "") -> Read:
        read = Read(content, reasoning)
        for parser in self.parsers:
            read = parser.feed(read)
        return self._seen(read)

    def flush(self) -> Read:
        """What the parsers still hold at the choice's end (a text that began like a call)."""
        read = Read()
        for parser in self.parsers:
            read = parser.flush(read)
        return self._seen(read)

    def read_all(self, content: str, reasoning: str) -> Read:
        """A whole collected output, read at once."""
        whole = self.feed(reasoning=reasoning) if reasoning else Read()
        answer = self.feed(content=content)
        rest = self.flush()
        return Read(
            content=answer.content + rest.content,
            reasoning=whole.reasoning + answer.reasoning,
            calls=answer.calls + rest.calls,
        )

    def _seen(self, read: Read) -> Read:
        self.calls += [event[2] for event in read.calls if event[0] == "call"]
        return read


@dataclass(frozen=True)
class Delta:
    """A piece of one choice's answer as its parsers read it: what the API's renderer writes
    for it (chat: one chunk; responses: its events), streamed."""

    index: int  # the choice
    content: str  # answer text ("" while a call reader holds text back)
    calls: list[CallEvent]  # calls begun and argument fragments, as `Read.calls`
    called: list[Call]  # every call of the choice read so far: `calls`' second items index it
    logprobs: Sequence[TokenLogprob] | None  # one per token of the piece; None: not asked for


@dataclass(frozen=True)
class Finished:
    """One choice's end as its parsers read it, streamed."""

    index: int  # the choice
    content: str  # text held back to the end (an answer that began like a call)
    calls: list[Call]  # every call the choice made (none: the answer is text)
    finish_reason: str  # the request's fold's (OutputSpec.finish_reason)


class StreamReader:
    """A streamed request's choices, each read once as its events come, by one ChoiceReader
    per choice: what a piece of thinking, a piece of answer and an end read as."""

    def __init__(self, output: OutputSpec, choices: int) -> None:
        self._readers = [output.reader() for _ in range(choices)]

    def thought(self, index: int, text: str) -> str:
        """The thinking text a piece reads as ("": nothing to send, e.g. left out)."""
        return self._readers[index].feed(reasoning=text).reasoning

    def delta(self, index: int, text: str, logprobs: Sequence[TokenLogprob] | None) -> Delta:
        """A piece of answer text (`logprobs`: one per token in it, None when not asked for)."""
        reader = self._readers[index]
        read = reader.feed(content=text)
        return Delta(index, read.content, read.calls, reader.calls, logprobs)

    def finish(self, index: int, finish_reason: str) -> tuple[Delta | None, Finished]:
        """The choice's end: a call's input its parsers still held (a piece to send before
        the end), and what they held as text, with every call it made."""
        reader = self._readers[index]
        rest = reader.flush()
        held = Delta(index, "", rest.calls, reader.calls, None) if rest.calls else None
        return held, Finished(index, rest.content, reader.calls, finish_reason)
