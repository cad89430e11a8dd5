"""Chunked prefill: a prompt longer than a step's token budget is prefilled over several
steps, each also decoding the running rows, and every output (greedy, float32) is the token
for token the one an unchunked engine gives: on a tiny random Llama and on the embedded
model, with the n choices of a prompt and a prompt whose prefix a slot kept."""

from __future__ import annotations

import asyncio

import pytest
import torch
from engine_runs import greedy, ids_of, prompts, tiny_builder

from gclm.server.engine.protocol import GenerationRequest
from gclm.server.engine.transformers import pace
from gclm.server.engine.transformers.engine import BatchEngine
from gclm.server.engine.transformers.pace import MIN_CHUNK

CHUNK = 16


@pytest.fixture(scope="module")
def tiny_engines(embedded_tokenizer, embedded_vocab, tiny_llama):
    """(chunked, unchunked) engines on one tiny random Llama in float32, every prompt on the
    engine thread (the side thread's: test_engine_side_prefill.py)."""
    build = tiny_builder(embedded_tokenizer, embedded_vocab, tiny_llama)
    engines = build(CHUNK, False), build(4096, False)
    yield engines
    for engine in engines:
        engine.shutdown()


async def together(engine: BatchEngine, requests: list[GenerationRequest]) -> list[list[int]]:
    """Every request's ids; each submitted once the engine sampled a token since the one
    before it was (a long prompt's later chunks run beside the rows already decoding)."""
    tasks = []
    for request in requests:
        sampled = engine.stats().as_dict()["tokens_sampled"]
        tasks.append(asyncio.ensure_future(ids_of(engine, request)))
        while engine.stats().as_dict()["tokens_sampled"] == sampled and not tasks[-1].done():
            await asyncio.sleep(0.002)
    return list(await asyncio.gather(*tasks))


@torch.no_grad()
def test_chunked_outputs_equal_unchunked_on_a_tiny_model(tiny_engines, passes):
    chunked, whole = tiny_engines
    long_a, long_b, short = prompts(3, 90, seed=1)
    short = short[:5]
    requests = [greedy(short, 30), greedy(long_a), greedy(long_b), greedy(long_a)]
    expected = [asyncio.run(ids_of(whole, r)) for r in requests]
    passes.clear()
    assert asyncio.run(together(chunked, requests)) == expected
    # No pass computed more than the budget's positions of prompt.
    assert max(max(p.values()) for p in passes) <= CHUNK
    # The n choices of a new long prompt share its chunked prefill, then each decodes.
    (fresh,) = prompts(1, 90, seed=4)
    runner, choice = greedy(short, 30), greedy(fresh, 8)

    async def choices() -> list[list[int]]:
        first = asyncio.ensure_future(ids_of(chunked, runner))
        while chunked.stats().as_dict()["batch_size"] == 0:
            await asyncio.sleep(0.002)
        before = chunked.stats().as_dict()["prefill_tokens"]
        both = await asyncio.gather(ids_of(chunked, choice), ids_of(chunked, choice))
        # Prefilled once: the second choice copies the first's slot, whether it came while
        # the first was prefilling (its last token too) or after (all but its last token).
        assert chunked.stats().as_dict()["prefill_tokens"] - before in (len(fresh), len(fresh) + 1)
        await first
        return list(both)

    assert asyncio.run(choices()) == [asyncio.run(ids_of(whole, choice))] * 2


@torch.no_grad()
def test_running_streams_decode_between_the_chunks_of_a_long_prompt(tiny_engines, passes):
    chunked, _ = tiny_engines
    (long,) = prompts(1, 120, seed=2)
    runner = greedy(prompts(1, 4, seed=3)[0], 60)

    async def run() -> None:
        prefilled = chunked.stats().as_dict()["prefill_tokens"]
        first = asyncio.ensure_future(ids_of(chunked, runner))
        while chunked.stats().as_dict()["prefill_tokens"] == prefilled:  # the runner's prompt is in
            await asyncio.sleep(0.005)
        passes.clear()
        before = chunked.stats().as_dict()
        await ids_of(chunked, greedy(long, 2))
        after = chunked.stats().as_dict()
        await first
        # /metrics' per-step figures: prompt tokens, chunks, steps and their time.
        assert after["prefill_tokens"] - before["prefill_tokens"] == len(long)
        steps = after["steps"] - before["steps"]
        assert steps >= after["prefill_chunks"] - before["prefill_chunks"] >= len(long) // CHUNK
        assert after["step_seconds"] > before["step_seconds"]

    asyncio.run(run())
    chunk_passes = [i for i, p in enumerate(passes) if max(p.values()) > 1]
    assert len(chunk_passes) >= 120 // CHUNK, passes
    # Between two chunks of the long prompt, the running row was fed (in the same pass or
    # its own): its slot appears in every step.
    steps = passes[chunk_passes[0] : chunk_passes[-1] + 1]
    runner_slots = {s for p in steps for s, n in p.items() if n == 1}
    assert runner_slots, passes
    decodes = sum(1 for p in steps if any(s in runner_slots for s in p))
    assert decodes >= len(chunk_passes) - 1, passes


@torch.no_grad()
def test_a_step_target_shrinks_the_chunks_only_while_streams_decode(
    tiny_engines, passes, monkeypatch
):
    """--max-step-seconds: beside a decoding stream the long prompt goes in timed chunks (no
    step can be as fast as the target here, and without the prefill share's floor, whose
    size depends on timings, every chunk is the smallest); alone, in one pass. The outputs
    are the unchunked engine's."""
    monkeypatch.setattr(pace, "MIN_PREFILL_SHARE", 0.0)
    chunked, whole = tiny_engines
    paced = BatchEngine(
        whole.model,
        whole.tokenizer,
        model_id="tiny",
        vocab=whole.vocab,
        cache=whole.constraints.cache,
        max_batch=4,
        kv_memory=16 << 20,
        draft_tokens=0,
        max_batched_tokens=4096,
        max_step_seconds=1e-6,
        prefill_thread=False,
    )
    (long,) = prompts(1, 120, seed=5)
    runner = greedy(prompts(1, 4, seed=6)[0], 60)
    try:
        passes.clear()
        assert asyncio.run(ids_of(paced, greedy(long, 4))) == asyncio.run(
            ids_of(whole, greedy(long, 4))
        )
        assert max(max(p.values()) for p in passes[:1]) == len(long)  # alone: one pass
        expected = [asyncio.run(ids_of(whole, r)) for r in (runner, greedy(long, 4))]
        passes.clear()
        assert asyncio.run(together(paced, [runner, greedy(long, 4)])) == expected
        # The long prompt's chunks (the runner's 4-token prompt aside).
        chunks = [max(p.values()) for p in passes if max(p.values()) > 4]
        assert chunks == [MIN_CHUNK] * 7 + [len(long) - 7 * MIN_CHUNK], chunks
    finally:
        paced.shutdown()


@torch.no_grad()
def test_chunked_outputs_equal_unchunked_on_the_embedded_model(float32_engine):
    whole, chunked = float32_engine(0), float32_engine(0, max_batched_tokens=64)
    text = "Here is a list of rivers and the maps drawn of them, one line each. " * 12
    prompt = whole.tokenizer.encode(text + "\nName three of them:")
    assert len(prompt) > 3 * 64
    requests = [greedy(whole.tokenizer.encode("Count: one, two,"), 24), greedy(prompt, 16)]
    expected = [asyncio.run(ids_of(whole, r)) for r in requests]
    before = chunked.stats().as_dict()["prefill_chunks"]
    assert asyncio.run(together(chunked, requests)) == expected
    assert chunked.stats().as_dict()["prefill_chunks"] - before >= 4
