"""The output tracker (server/engine/output.py): sampled token ids in, exact events out, for
the transformers engine (one token a call, the tracker decodes and decides the end) and for
vLLM (a delta of tokens with vLLM's text, vLLM's reason)."""

from __future__ import annotations

import numpy as np
import pytest

from gclm.compiler.whole.tables import CompiledTable, build_table
from gclm.errors import GclmError, InternalError
from gclm.masking.reasoning import ThinkingSpec
from gclm.server.engine.output import OutputTracker
from gclm.server.engine.protocol import (
    ErrorEvent,
    FinishEvent,
    GenerationRequest,
    PreparedConstraint,
    SamplingParams,
    StreamEvent,
    TokenEvent,
    TokenLogprob,
)

EOS = 0
# 0 EOS, 1 "a", 2-3 "é" split in two, 4-6 the end marker "</" "think" ">", 7 "{", 8 "}"
BYTES = (None, b"a", "é".encode()[:1], "é".encode()[1:], b"</", b"think", b">", b"{", b"}")
MARKER = (4, 5, 6)


def lp(i: int) -> TokenLogprob:
    return TokenLogprob(f"t{i}", None, -float(i))


def braces() -> CompiledTable:
    """The answer "{}": "{" then "}"."""
    return build_table(
        vocab_size=len(BYTES),
        eos_token_id=EOS,
        initial=0,
        num_states=3,
        accepting=np.array([False, False, True]),
        src=np.array([0, 1]),
        tokens=np.array([7, 8]),
        dst=np.array([1, 2]),
    )


def a_plus() -> CompiledTable:
    """One or more "a" (regex a+)."""
    return build_table(
        vocab_size=len(BYTES),
        eos_token_id=EOS,
        initial=0,
        num_states=2,
        accepting=np.array([False, True]),
        src=np.array([0, 1]),
        tokens=np.array([1, 1]),
        dst=np.array([1, 1]),
    )


def tracker(
    max_tokens: int = 8,
    table: CompiledTable | None = None,
    *,
    stop: tuple[str, ...] = (),
    thinking: bool = False,
    budget_aware: bool = True,
) -> tuple[OutputTracker, list[StreamEvent]]:
    params = SamplingParams(max_tokens=max_tokens, stop=stop)
    spec = ThinkingSpec(MARKER) if thinking else None
    request = GenerationRequest(
        [1, 1],
        params,
        constraint=None
        if table is None
        else PreparedConstraint.of(table, budget_aware=budget_aware),
        thinking=spec,
    )
    sent: list[StreamEvent] = []
    return OutputTracker(request, BYTES, sent.append), sent


def one_by_one(out: OutputTracker, tokens: list[int], with_logprobs: bool = False) -> str | None:
    """The transformers engine's way: one token a call, finished on the tracker's reason."""
    for t in tokens:
        reason = out.take((t,), (lp(t),) if with_logprobs else (), eos_ids={EOS})
        if reason is not None:
            out.finish(reason)
            return reason
    return None


def test_a_split_character_waits_with_its_logprob() -> None:
    out, sent = tracker()
    assert one_by_one(out, [1, 2, 3, EOS], with_logprobs=True) == "stop"
    assert sent == [
        TokenEvent("a", (1,), (lp(1),)),
        TokenEvent("é", (2, 3), (lp(2), lp(3))),
        FinishEvent("stop", 2, 4),
    ]


def test_a_stop_string_ends_the_text_before_it() -> None:
    """An "a" waits while it may begin the stop string; the stop string's tokens are sent
    at the end, its text is not."""
    out, sent = tracker(stop=("aé",))
    assert one_by_one(out, [1, 1, 2, 3, 1]) == "stop"
    assert sent == [TokenEvent("a", (1, 1)), TokenEvent("", (2, 3)), FinishEvent("stop", 2, 4)]


def test_free_text_out_of_budget_is_length_and_cut() -> None:
    out, sent = tracker(max_tokens=2)
    assert one_by_one(out, [1, 1, 1]) == "length"
    assert sent[-1] == FinishEvent("length", 2, 2, budget_cut=True)


def test_a_constrained_output_ends_where_nothing_can_follow() -> None:
    """No EOS needed: "{}" is complete and no token continues it; stop strings are not
    looked for in a constrained output."""
    out, sent = tracker(table=braces(), stop=("{",))
    assert one_by_one(out, [7, 8]) == "stop"
    assert sent == [TokenEvent("{", (7,)), TokenEvent("}", (8,)), FinishEvent("stop", 2, 2)]


@pytest.mark.parametrize(
    ("tokens", "max_tokens", "finish"),
    [
        ([1, 1], 2, FinishEvent("stop", 2, 2, budget_cut=True)),  # complete, could go on
        ([1, EOS], 2, FinishEvent("stop", 2, 2)),  # the model ended on its last token
        ([1], 1, FinishEvent("stop", 2, 1, budget_cut=True)),
    ],
)
def test_the_budget_rule(tokens, max_tokens, finish) -> None:
    out, sent = tracker(max_tokens, a_plus())
    one_by_one(out, tokens)
    assert sent[-1] == finish


def test_a_budget_unaware_output_cut_midway_is_length() -> None:
    out, sent = tracker(1, braces(), budget_aware=False)
    assert one_by_one(out, [7]) == "length"
    assert sent[-1] == FinishEvent("length", 2, 1, budget_cut=True)


def test_eos_ids_end_only_a_free_output() -> None:
    """A constrained output ends where its state takes the table's EOS; eos_ids are for
    free text (a stop token id vLLM names, the model's other EOS ids)."""
    out, sent = tracker()
    assert out.take((1, 9), eos_ids={9}) == "stop"
    assert out.output_ids == [1] and out.generated == 2
    out, _ = tracker(table=a_plus())
    with pytest.raises(InternalError, match="not allowed"):
        out.take((1, 5), eos_ids={5})


def test_a_token_outside_the_constraint_raises() -> None:
    out, _ = tracker(table=braces())
    with pytest.raises(InternalError):
        out.take((1,))


def test_thinking_split_one_token_at_a_time() -> None:
    """The marker's start is held while it may be the marker: sent when the match breaks,
    dropped (its tokens sent, its text not) when it completes."""
    out, sent = tracker(12, braces(), thinking=True)
    assert one_by_one(out, [1, 4, 1, *MARKER, 7, 8]) == "stop"
    assert sent == [
        TokenEvent("a", (1,), reasoning=True),
        TokenEvent("</a", (4, 1), reasoning=True),
        TokenEvent("", MARKER, reasoning=True),
        TokenEvent("{", (7,)),
        TokenEvent("}", (8,)),
        FinishEvent("stop", 2, 8, reasoning_tokens=6),
    ]


def test_vllm_delta_one_event_per_kind_and_vllms_text_ignored_while_thinking() -> None:
    """A delta that runs through the marker into the answer: one thinking event, one answer
    event; vLLM's text is not used (the split is by token); the EOS vLLM names is counted and
    advances the constraint, and is in no event."""
    out, sent = tracker(12, braces(), thinking=True)
    assert out.take((1, *MARKER, 7), text="vLLM's text") is None
    out.take((8, EOS), eos_ids=(EOS,), text="x")
    out.finish("stop")
    assert sent == [
        TokenEvent("a", (1, *MARKER), reasoning=True),
        TokenEvent("{", (7,)),
        TokenEvent("}", (8,)),
        FinishEvent("stop", 2, 7, reasoning_tokens=4),
    ]


def test_vllms_text_is_sent_as_it_is() -> None:
    """Without thinking vLLM's text goes out unchanged with the delta's tokens (EOS left
    out); a delta without text is sent for its logprobs, and not at all without them."""
    out, sent = tracker()
    out.take((1, 2), (lp(1), lp(2)), text="A")
    out.take((3,), (lp(3),), text="")
    out.take((1,), text="")
    out.take((1, EOS), (lp(1),), eos_ids=(EOS,), text="b")
    out.finish("stop")
    assert sent == [
        TokenEvent("A", (1, 2), (lp(1), lp(2))),
        TokenEvent("", (3,), (lp(3),)),
        TokenEvent("b", (1,), (lp(1),)),
        FinishEvent("stop", 2, 6),
    ]


def test_cut_off_while_thinking_sends_the_held_text_as_thinking() -> None:
    out, sent = tracker(3, thinking=True)
    assert one_by_one(out, [1, 4, 5]) == "length"
    assert sent == [
        TokenEvent("a", (1,), reasoning=True),
        TokenEvent("</think", (4, 5), reasoning=True),
        FinishEvent("length", 2, 3, budget_cut=True, reasoning_tokens=3),
    ]


def test_finish_and_fail_send_once() -> None:
    out, sent = tracker()
    out.cached_tokens = 1
    out.take((1,))
    out.finish("cancelled")
    out.finish("stop")
    out.fail(RuntimeError("late"))
    assert sent == [TokenEvent("a", (1,)), FinishEvent("cancelled", 2, 1, cached_tokens=1)]
    out, sent = tracker()
    out.fail(RuntimeError("boom"))
    out.finish("stop")
    assert len(sent) == 1 and isinstance(sent[0], ErrorEvent)
    assert isinstance(sent[0].error, GclmError) and sent[0].error.message == "boom"
