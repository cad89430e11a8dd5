"""A sequence's events: tokens that split a character wait, with their logprobs, for the
token that completes it; EOS sends no token; the finish tells a budget cut from an end."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.tables import CompiledTable, build_table
from gclm.masking.reasoning import ThinkingSpec
from gclm.server.engine.protocol import (
    FinishEvent,
    GenerationRequest,
    PreparedConstraint,
    SamplingParams,
    StreamEvent,
    TokenEvent,
    TokenLogprob,
)
from gclm.server.engine.transformers.sequence import Sequence

pytestmark = pytest.mark.anyio

EOS = 0
VOCAB = TokenVocabulary((None, b"a", "é".encode()[:1], "é".encode()[1:]), EOS, "plain")


def logprob(i: int) -> TokenLogprob:
    return TokenLogprob(f"t{i}", None, -float(i))


async def events_of(tokens: list[int], with_logprobs: bool = True) -> list[StreamEvent]:
    params = SamplingParams(max_tokens=8, logprobs=0 if with_logprobs else None)
    seq = Sequence(
        request=GenerationRequest(prompt_ids=[1], params=params),
        request_id="r",
        loop=asyncio.get_running_loop(),
        vocab=VOCAB,
    )
    for t in tokens:
        if seq.update(t, frozenset({EOS}), logprob(t) if with_logprobs else None):
            break
    await asyncio.sleep(0)  # the events are sent with call_soon_threadsafe
    out = []
    while not seq.events.empty():
        out.append(seq.events.get_nowait())
    return out


async def test_split_character_waits_with_its_logprobs() -> None:
    events = await events_of([1, 2, 3, EOS])
    assert events == [
        TokenEvent("a", (1,), (logprob(1),)),
        TokenEvent("é", (2, 3), (logprob(2), logprob(3))),
        FinishEvent("stop", 1, 4),
    ]


async def test_a_dangling_byte_is_sent_at_the_end() -> None:
    events = await events_of([1, 2, EOS])
    assert events[1] == TokenEvent("\ufffd", (2,), (logprob(2),))
    assert isinstance(events[-1], FinishEvent)


async def test_no_logprobs_unless_asked() -> None:
    events = await events_of([1, 2, 3, EOS], with_logprobs=False)
    assert [e.logprobs for e in events if isinstance(e, TokenEvent)] == [(), ()]


def loop_table(loop: bool) -> CompiledTable:
    """'a' then, with `loop`, any more 'a's (regex a+); without, the output closes at 'a'."""
    src, dst = ([0, 1], [1, 1]) if loop else ([0], [1])
    return build_table(
        vocab_size=len(VOCAB.token_bytes),
        eos_token_id=EOS,
        initial=0,
        num_states=2,
        accepting=np.array([False, True]),
        src=np.array(src),
        tokens=np.array([1] * len(src)),
        dst=np.array(dst),
    )


async def finish_of(table: CompiledTable | None, tokens: list[int], max_tokens: int) -> FinishEvent:
    seq = Sequence(
        request=GenerationRequest(
            [1],
            SamplingParams(max_tokens=max_tokens),
            constraint=None if table is None else PreparedConstraint.of(table),
        ),
        request_id="r",
        loop=asyncio.get_running_loop(),
        vocab=VOCAB,
    )
    seq.cached_tokens = 5
    for t in tokens:
        if seq.update(t, frozenset({EOS})):
            break
    await asyncio.sleep(0)
    events = []
    while not seq.events.empty():
        events.append(seq.events.get_nowait())
    assert isinstance(events[-1], FinishEvent)
    return events[-1]


async def test_a_budget_cut_is_reported_apart_from_an_end() -> None:
    # Cut while the constraint could go on: complete ("stop"), but cut.
    assert await finish_of(loop_table(True), [1, 1], 2) == FinishEvent("stop", 1, 2, 5, True)
    # The model ended (EOS) on the last token of its budget: not cut.
    assert await finish_of(loop_table(True), [1, EOS], 2) == FinishEvent("stop", 1, 2, 5, False)
    # The constraint closed as the budget ran out: not cut.
    assert await finish_of(loop_table(False), [1], 1) == FinishEvent("stop", 1, 1, 5, False)
    # Free text cut by the budget.
    assert await finish_of(None, [1, 1], 2) == FinishEvent("length", 1, 2, 5, True)


# A vocabulary whose end marker "</think>" is three tokens: "</", "think", ">".
THINK_VOCAB = TokenVocabulary((None, b"a", b"</", b"think", b">", b"{", b"}"), EOS, "plain")
END_IDS = (2, 3, 4)


async def thinking_events(tokens: list[int], constrained: bool) -> list[StreamEvent]:
    # The answer "{}": "{" then "}".
    table = build_table(
        vocab_size=7,
        eos_token_id=EOS,
        initial=0,
        num_states=3,
        accepting=np.array([False, False, True]),
        src=np.array([0, 1]),
        tokens=np.array([5, 6]),
        dst=np.array([1, 2]),
    )
    table = table if constrained else None
    request = GenerationRequest(
        prompt_ids=[1],
        params=SamplingParams(max_tokens=12),
        constraint=None if table is None else PreparedConstraint.of(table),
        thinking=ThinkingSpec(END_IDS),
    )
    seq = Sequence(
        request=request, request_id="r", loop=asyncio.get_running_loop(), vocab=THINK_VOCAB
    )
    for t in tokens:
        if seq.update(t, frozenset({EOS})):
            break
    await asyncio.sleep(0)
    out = []
    while not seq.events.empty():
        out.append(seq.events.get_nowait())
    return out


@pytest.mark.parametrize("constrained", [True, False])
async def test_thinking_text_leaves_the_end_marker_out(constrained: bool) -> None:
    """Marker tokens are held back while they may be the marker: sent as thinking when the
    match breaks ("</" then "a"), dropped when it completes; the answer follows."""
    events = await thinking_events([1, 2, 1, 2, 3, 4, 5, 6, EOS], constrained)
    assert events == [
        TokenEvent("a", (1,), reasoning=True),
        TokenEvent("</a", (2, 1), reasoning=True),
        TokenEvent("", (2, 3, 4), reasoning=True),
        TokenEvent("{", (5,)),
        TokenEvent("}", (6,)),
        FinishEvent("stop", 1, 8 if constrained else 9, reasoning_tokens=6),
    ]


async def test_an_outbox_hands_a_steps_events_over_in_one_call(monkeypatch) -> None:
    """Events sent on the outbox's thread wait for `flush`, then reach each sequence's queue
    in order through one call_soon_threadsafe; from any other thread they go at once."""
    import threading

    from gclm.server.engine.transformers.sequence import Outbox, _deliver

    loop = asyncio.get_running_loop()
    calls = []
    real = loop.call_soon_threadsafe

    def counted(callback, *args):
        if callback is _deliver or getattr(callback, "__name__", "") == "put_nowait":
            calls.append(callback)  # the engine's hand-offs, not asyncio.to_thread's own
        return real(callback, *args)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counted)
    outbox = Outbox()
    params = SamplingParams(max_tokens=8)
    seqs = [
        Sequence(
            request=GenerationRequest(prompt_ids=[1], params=params),
            request_id=str(i),
            loop=loop,
            vocab=VOCAB,
            outbox=outbox,
        )
        for i in range(3)
    ]

    def step() -> None:
        outbox.owner = threading.get_ident()
        for _ in range(2):
            for seq in seqs:
                seq.update(1, frozenset({EOS}))
        assert not calls  # held until the step's end
        outbox.flush()

    await asyncio.to_thread(step)
    assert len(calls) == 1
    await asyncio.sleep(0)
    for seq in seqs:
        assert [seq.events.get_nowait() for _ in range(2)] == [TokenEvent("a", (1,))] * 2
    seqs[0].update(EOS, frozenset({EOS}))  # not the owner's thread: sent at once
    assert len(calls) == 2
    await asyncio.sleep(0)
    assert seqs[0].events.get_nowait() == FinishEvent("stop", 1, 3)


def test_an_outbox_drops_the_events_of_a_closed_loop() -> None:
    """A request whose event loop ended (a client's asyncio.run returned) has nobody to read
    its events: they are dropped, and the engine's thread goes on (it used to die of the
    closed loop's RuntimeError, taking every other request with it)."""
    from gclm.server.engine.transformers.sequence import Outbox

    closed, open_loop = asyncio.new_event_loop(), asyncio.new_event_loop()
    closed.close()
    try:
        outbox = Outbox()  # no owner: events go at once, as from a thread not the engine's
        queue: asyncio.Queue = asyncio.Queue()
        outbox.send(closed, queue, "lost")  # no raise
        outbox.owner = threading.get_ident()
        outbox.send(closed, queue, "lost too")
        outbox.send(open_loop, queue, "kept")
        outbox.flush()  # no raise: the closed loop's batch is dropped, the other delivered
        open_loop.run_until_complete(asyncio.sleep(0))
        assert queue.get_nowait() == "kept" and queue.empty()
    finally:
        open_loop.close()
