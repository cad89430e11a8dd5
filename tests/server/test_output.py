"""Output parsers (server/openai/output.py): a choice's output read as thinking, answer text
and tool calls by a list of parsers, piece by piece or whole, with the same result; a stream's
choices read once each, as their pieces come (StreamReader)."""

from __future__ import annotations

from gclm.server.engine.protocol import FinishEvent
from gclm.server.openai.output import PLAIN, Finished, OutputSpec, Read, StreamReader
from gclm.server.openai.reasoning import ReasoningParser

THINK = ReasoningParser("qwen3", "<think>", "</think>", (7,))
CALL = '<tool_call>[{"name": "f", "arguments": {"x": 1}}]'


def test_plain_output_reads_as_its_text() -> None:
    reader = PLAIN.reader()
    assert reader.feed(content="Hi") == Read(content="Hi")
    assert reader.flush() == Read()
    assert reader.calls == []


def test_thinking_strips_the_start_marker_once() -> None:
    reader = OutputSpec(thinking=THINK).reader()
    assert reader.feed(reasoning="<think>a").reasoning == "a"
    assert reader.feed(reasoning="<think>").reasoning == "<think>"  # later text is text


def test_thinking_left_out() -> None:
    reader = OutputSpec(thinking=THINK, include_reasoning=False).reader()
    assert reader.feed(reasoning="<think>a") == Read()


def test_thinking_then_calls_streamed_as_read_whole() -> None:
    spec = OutputSpec(thinking=THINK, tool_calls=True)
    streamed = spec.reader()
    pieces = [streamed.feed(reasoning="<think>hm")]
    pieces += [streamed.feed(content=ch) for ch in CALL]
    pieces.append(streamed.flush())
    assert "".join(p.reasoning for p in pieces) == "hm"
    assert "".join(p.content for p in pieces) == ""
    events = [e for p in pieces for e in p.calls]
    assert events[0][:2] == ("call", 0)
    assert {e[:2] for e in events[1:]} == {("args", 0)}  # one fragment per character here
    assert "".join(e[2] for e in events[1:]) == '{"x": 1}'

    whole = spec.reader()
    read = whole.read_all(CALL, "<think>hm")
    assert (read.content, read.reasoning) == ("", "hm")
    assert [(c.name, c.arguments) for c in whole.calls] == [("f", '{"x": 1}')]
    assert [(c.name, c.arguments) for c in streamed.calls] == [("f", '{"x": 1}')]


def test_text_that_begins_like_a_call_is_flushed_as_text() -> None:
    reader = OutputSpec(tool_calls=True).reader()
    assert reader.feed(content="<tool").content == ""
    assert reader.flush() == Read(content="<tool")
    assert reader.calls == []


def test_finish_reason_a_budget_cut_is_length_only_where_calls_may_come() -> None:
    cut = FinishEvent("stop", prompt_tokens=1, completion_tokens=2, budget_cut=True)
    assert PLAIN.finish_reason(cut) == "stop"  # a constrained output cut so is complete
    assert OutputSpec(thinking=THINK).finish_reason(cut) == "stop"
    assert OutputSpec(tool_calls=True).finish_reason(cut) == "length"


def test_a_stream_reads_each_choice_once_and_hands_on_what_it_read() -> None:
    reader = StreamReader(OutputSpec(thinking=THINK, tool_calls=True), choices=2)
    assert reader.thought(0, "<think>hm") == "hm"
    opened = reader.delta(0, '<tool_call>[{"name": "f", ', None)
    [call] = opened.called
    assert (opened.index, opened.content, opened.calls) == (0, "", [("call", 0, call)])
    args = reader.delta(0, '"arguments": {"x": 1}}]', None)
    assert (args.content, args.calls, args.called) == ("", [("args", 0, '{"x": 1}')], [call])
    held = reader.delta(1, "<tool", ())  # choice 1: text that began like a call
    assert (held.index, held.content, held.calls, held.logprobs) == (1, "", [], ())
    assert reader.finish(1, "stop") == (None, Finished(1, "<tool", [], "stop"))
    assert reader.finish(0, "stop") == (None, Finished(0, "", [call], "stop"))
    assert (call.name, call.arguments) == ("f", '{"x": 1}')
