"""A long prompt prefilled on a thread of its own (side_prefill.py): the running rows decode
while it is, every output (greedy, float32) is the one an engine prefilling every prompt on
its engine thread gives, and a cancelled or failed prompt leaves the engine serving."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from engine_runs import collect, greedy, ids_of, prompts, tiny_builder

from gclm.server.engine.transformers.engine import BatchEngine
from gclm.server.engine.transformers.side_prefill import SIDE_MIN_TOKENS

CHUNK = 16
LONG = SIDE_MIN_TOKENS + 30  # a prompt that goes to the side thread


@pytest.fixture(scope="module")
def engines(embedded_tokenizer, embedded_vocab, tiny_llama):
    """(side, plain): engines on one tiny random Llama in float32, the first prefilling long
    prompts on its side thread in chunks of CHUNK tokens, the second every prompt in one
    pass on its engine thread."""
    build = tiny_builder(embedded_tokenizer, embedded_vocab, tiny_llama)
    built = build(CHUNK, True), build(4096, False)
    yield built
    for engine in built:
        engine.shutdown()


def counts(engine: BatchEngine) -> dict:
    return engine.stats().as_dict()


class Gate:
    """Holds the side thread before each of its passes until `open()`; `entered` is set
    once it waits."""

    def __init__(self, engine: BatchEngine, monkeypatch) -> None:
        assert engine._prefills.side is not None
        store = engine._prefills.side.store
        extend = store.extend
        self.entered, self.opened = threading.Event(), threading.Event()

        def held(*args, **kwargs):
            self.entered.set()
            assert self.opened.wait(30), "the gate was never opened"
            return extend(*args, **kwargs)

        monkeypatch.setattr(store, "extend", held)

    def open(self) -> None:
        self.opened.set()


@torch.no_grad()
def test_outputs_equal_a_prompt_prefilled_on_the_engine_thread(engines):
    side, plain = engines
    long_a, long_b, short = prompts(3, LONG, seed=1)
    requests = [greedy(short[:5], 40), greedy(long_a), greedy(long_b)]
    expected = [asyncio.run(ids_of(plain, r)) for r in requests]
    before = counts(side)

    async def run() -> list[list[int]]:
        tasks = []
        for request in requests:
            tasks.append(asyncio.ensure_future(ids_of(side, request)))
            await asyncio.sleep(0.01)
        return list(await asyncio.gather(*tasks))

    # One long prompt goes beside; the other too, or in chunks on the engine thread while
    # the side thread is busy.
    assert asyncio.run(run()) == expected
    assert counts(side)["side_prefills"] > before["side_prefills"]
    # long_a and more, once long_a ran alone (a slot keeps it): the side thread starts from
    # that slot's copy.
    asyncio.run(ids_of(side, greedy(long_a)))
    (more,) = prompts(1, SIDE_MIN_TOKENS + 6, seed=2)
    request = greedy(long_a + more)
    before = counts(side)
    assert asyncio.run(ids_of(side, request)) == asyncio.run(ids_of(plain, request))
    assert counts(side)["side_prefill_tokens"] - before["side_prefill_tokens"] == len(more)


@torch.no_grad()
def test_the_rows_decode_while_a_long_prompt_is_prefilled_beside(engines, monkeypatch):
    side, plain = engines
    (long,) = prompts(1, LONG, seed=3)
    runner = greedy(prompts(1, 4, seed=4)[0], 200)
    expected = asyncio.run(ids_of(plain, greedy(long, 4)))
    gate = Gate(side, monkeypatch)

    async def run() -> list[int]:
        streamed: list[int] = []
        first = asyncio.ensure_future(collect(side, side.submit(runner), streamed))
        while not streamed:
            await asyncio.sleep(0.002)
        answer = asyncio.ensure_future(ids_of(side, greedy(long, 4)))
        while not gate.entered.is_set():
            await asyncio.sleep(0.002)
        # The side thread holds the long prompt; the runner goes on decoding.
        held_at = len(streamed)
        while len(streamed) < held_at + 20 and not first.done():
            await asyncio.sleep(0.002)
        assert len(streamed) >= held_at + 20, "the running row stalled behind the prefill"
        assert counts(side)["prefilling"] == 1 and not answer.done()
        gate.open()
        ids = await answer
        await first
        return ids

    assert asyncio.run(run()) == expected


@torch.no_grad()
def test_the_choices_of_a_long_prompt_share_its_prefill_beside(engines):
    side, plain = engines
    (fresh,) = prompts(1, LONG, seed=5)
    choice = greedy(fresh, 8)
    before = counts(side)

    async def both() -> list[list[int]]:
        return list(await asyncio.gather(ids_of(side, choice), ids_of(side, choice)))

    assert asyncio.run(both()) == [asyncio.run(ids_of(plain, choice))] * 2
    assert counts(side)["side_prefill_tokens"] - before["side_prefill_tokens"] == len(fresh)


@torch.no_grad()
def test_a_prompt_cancelled_beside_frees_its_slot(engines, monkeypatch):
    side, plain = engines
    (long,) = prompts(1, LONG, seed=6)
    gate = Gate(side, monkeypatch)
    free = counts(side)["kv_slots_free"]

    async def run() -> None:
        handle = side.submit(greedy(long, 4))
        while not gate.entered.is_set():
            await asyncio.sleep(0.002)
        assert counts(side)["kv_slots_free"] == free - 1
        side.cancel(handle)
        while counts(side)["kv_slots_free"] != free:
            await asyncio.sleep(0.002)
        assert counts(side)["prefilling"] == 0

    asyncio.run(run())
    gate.open()
    (other,) = prompts(1, LONG, seed=7)
    assert asyncio.run(ids_of(side, greedy(other, 4))) == asyncio.run(
        ids_of(plain, greedy(other, 4))
    )


@torch.no_grad()
def test_a_failed_prefill_beside_fails_its_request_only(engines, monkeypatch):
    side, plain = engines
    assert side._prefills.side is not None

    def broken(*args, **kwargs):
        raise RuntimeError("out of memory, say")

    monkeypatch.setattr(side._prefills.side.store, "extend", broken)
    (long,) = prompts(1, LONG, seed=8)
    runner = greedy(prompts(1, 4, seed=9)[0], 30)

    async def run() -> list[int]:
        first = asyncio.ensure_future(ids_of(side, runner))
        await asyncio.sleep(0.01)
        with pytest.raises(Exception, match="Prefill failed: RuntimeError"):
            await ids_of(side, greedy(long, 4))
        return await first

    assert asyncio.run(run()) == asyncio.run(ids_of(plain, runner))
    side.check_health()
    assert counts(side)["kv_slots_free"] == 4


@torch.no_grad()
def test_outputs_equal_on_the_embedded_model(float32_engine):
    plain, side = float32_engine(0), float32_engine(0, max_batched_tokens=64, prefill_thread=True)
    text = "Here is a list of rivers and the maps drawn of them, one line each. " * 12
    prompt = side.tokenizer(text)["input_ids"]
    assert len(prompt) > 2 * 64
    request = greedy(prompt, 12)
    before = counts(side)["side_prefills"]
    assert asyncio.run(ids_of(side, request)) == asyncio.run(ids_of(plain, request))
    assert counts(side)["side_prefills"] == before + 1
