"""A sequence's events: tokens that split a character wait, with their logprobs, for the
token that completes it; EOS sends no token."""

from __future__ import annotations

import asyncio

import pytest

from gclm.compiler.vocabulary import TokenVocabulary
from gclm.server.engine.protocol import (
    FinishEvent,
    GenerationRequest,
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
