"""Admission by KV capacity: a request waits for a slot rather than being refused while
slots are free; 429 queue_full only past the free slots plus --queue-size, with a
Retry-After that grows with the queue ahead and with how long a sequence holds its slot."""

from __future__ import annotations

import asyncio
import time

import pytest

from gclm.compiler.service.cache import TableCache
from gclm.compiler.whole.compile import compile_constraint
from gclm.errors import QueueFullError
from gclm.server.engine.protocol import FinishEvent, GenerationRequest, SamplingParams
from gclm.server.engine.transformers.admission import AdmissionQueue
from gclm.server.engine.transformers.engine import BatchEngine
from gclm.server.engine.transformers.sequence import Sequence


@pytest.fixture
def sequence(embedded_vocab):
    """`sequence()`: a Sequence no engine runs (its events would go to a closed loop)."""
    loop = asyncio.new_event_loop()
    request = GenerationRequest(prompt_ids=[1, 2], params=SamplingParams(max_tokens=2))
    yield lambda: Sequence(request=request, request_id="r", loop=loop, vocab=embedded_vocab)
    loop.close()


def test_the_queue_takes_the_free_slots_plus_its_size(sequence) -> None:
    queue = AdmissionQueue(slots=8, queue_size=4)
    for _ in range(12):  # 8 free slots + 4 waiting beyond them
        queue.put(sequence())
    with pytest.raises(QueueFullError) as caught:
        queue.put(sequence())
    assert caught.value.code == "queue_full"
    assert caught.value.retry_after == 1.0  # nothing has finished yet: one batch, 1 s
    assert queue.counts["queue_full_rejections"] == 1
    # The engine admits 8: they hold every slot; 4 still wait, the queue is full.
    assert len(queue.take(8)) == 8
    queue.free = 0
    with pytest.raises(QueueFullError):
        queue.put(sequence())


def test_retry_after_counts_the_batches_ahead_and_the_hold_time(sequence) -> None:
    queue = AdmissionQueue(slots=2, queue_size=6)
    done = sequence()
    done.admitted_at = time.monotonic() - 3.0
    queue.finished(done)  # a sequence holds its slot ~3 s
    queue.free = 0
    for _ in range(6):
        queue.put(sequence())
    with pytest.raises(QueueFullError) as caught:
        queue.put(sequence())
    # 7 ahead of a new request (6 waiting + itself) on 2 slots: 4 batches of ~3 s.
    assert 12.0 <= caught.value.retry_after <= 13.0
    assert "Retry after 1" in str(caught.value)


@pytest.fixture(scope="module")
def engine(embedded_tokenizer, embedded_vocab, tiny_llama):
    model = tiny_llama(vocab_size=embedded_vocab.size, max_position_embeddings=256)
    cache = TableCache(lambda c: compile_constraint(c, embedded_vocab), embedded_vocab.fingerprint)
    engine = BatchEngine(
        model,
        embedded_tokenizer,
        model_id="tiny",
        vocab=embedded_vocab,
        cache=cache,
        max_batch=48,
        kv_memory=32 << 20,
        queue_size=8,
    )
    yield engine
    engine.shutdown()


def test_a_burst_larger_than_the_queue_waits_for_free_slots(engine) -> None:
    """56 requests at once on 48 free slots and a queue of 8: every one is taken (the old
    rule refused all past the 8th), the 57th is refused, and all 56 finish."""

    async def burst() -> tuple[int, list[str]]:
        handles = []
        for i in range(56):  # no await in between: the engine admits between passes
            request = GenerationRequest(
                prompt_ids=[5 + i, 6, 7], params=SamplingParams(max_tokens=12, temperature=0)
            )
            handles.append(engine.submit(request))
        with pytest.raises(QueueFullError):
            engine.submit(request)
        reasons = []
        for handle in handles:
            async for event in engine.stream(handle):
                if isinstance(event, FinishEvent):
                    reasons.append(event.finish_reason)
        return len(handles), reasons

    taken, reasons = asyncio.run(burst())
    assert taken == 56 and len(reasons) == 56
    stats = engine.stats().as_dict()
    assert stats["queue_full_rejections"] == 1
    assert stats["admitted"] >= 56
    # A finish event is sent before the engine thread frees the slot: wait for that.
    deadline = time.monotonic() + 30
    while engine.stats().as_dict()["kv_slots_free"] < 48 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.stats().as_dict()["kv_slots_free"] == 48
