"""StepPace: prefill chunks sized from timed steps so that running streams wait about the
target per step, the prompt's first token no more than 1 + 1 / MIN_PREFILL_SHARE times
later than unchunked, and the token budget alone when nothing decodes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gclm.server.engine.transformers.pace import (
    MIN_CHUNK,
    MIN_PREFILL_SHARE,
    PROBE_TOKENS,
    StepPace,
)


def prefill(
    pace: StepPace, prompt: int, decode: float, fixed: float, per_token: Callable[[int], float]
) -> list[tuple[int, float]]:
    """Feed a `prompt`-token prompt beside decoding rows, each step costing `decode` +
    `fixed` + the chunk's tokens (`per_token(position)` each): [(chunk, seconds)]."""
    pace.observe(0, decoding=True, seconds=decode)
    steps, done = [], 0
    while done < prompt:
        chunk = min(pace.chunk(decoding=True, remaining=prompt - done), prompt - done)
        seconds = decode + fixed + sum(per_token(p) for p in range(done, done + chunk))
        pace.observe(chunk, decoding=True, seconds=seconds)
        steps.append((chunk, seconds))
        done += chunk
    return steps


def dearer(position: int) -> float:
    """A 4k-token prompt's tokens: 4 ms at its start, 10 ms at its end (more keys)."""
    return 0.004 + 0.006 * position / 4000


def test_nothing_decoding_or_no_target_means_the_token_budget() -> None:
    pace = StepPace(0.5, ceiling=512)
    assert pace.chunk(decoding=False) == 512
    assert StepPace(None, ceiling=512).chunk(decoding=True) == 512


def test_a_probe_first_then_the_chunk_that_fits_the_target() -> None:
    pace = StepPace(0.5, ceiling=512)
    assert pace.chunk(decoding=True) == PROBE_TOKENS
    pace.observe(0, decoding=True, seconds=0.05)  # a decode-only step: 0.05 s
    pace.observe(32, decoding=True, seconds=0.05 + 32 * 0.01)  # 10 ms per prompt token
    assert pace.decode_s == pytest.approx(0.05) and pace.per_token_s == pytest.approx(0.01)
    assert pace.chunk(decoding=True) == 45  # (0.5 - 0.05) / 0.01
    assert pace.chunk(decoding=False) == 512


@pytest.mark.parametrize("fixed", [0.0, 0.1])
def test_a_long_prompt_keeps_to_the_target_as_its_chunks_grow_dearer(fixed: float) -> None:
    """Beside a 0.15 s decode, each step also paying `fixed`: past the first steps every
    step keeps near the 1 s target, the early chunks' savings paying for the last ones
    (whose own share of the step is under MIN_PREFILL_SHARE times the decode's), and the
    first token comes within 1 + 1 / MIN_PREFILL_SHARE of the prompt's own seconds."""
    pace = StepPace(1.0, ceiling=512)
    steps = prefill(pace, 4000, 0.15, fixed, dearer)
    assert max(seconds for _, seconds in steps[4:]) <= 1.1
    assert min(seconds for _, seconds in steps[4:-1]) >= 0.85
    prompt_s = sum(map(dearer, range(4000)))
    assert sum(seconds for _, seconds in steps) <= (
        1 + 1 / MIN_PREFILL_SHARE
    ) * prompt_s + fixed * len(steps)
    assert steps[-2][0] < steps[len(steps) // 2][0]  # the chunks shrank as they grew dearer


def test_a_step_too_slow_for_the_target_keeps_the_prefill_moving() -> None:
    """Decoding alone outlasts the target: the prompt's tokens still get MIN_PREFILL_SHARE
    times the decode parts (its first token is not put off without end), the chunk growing
    at most twofold per step and no larger than that share needs."""
    slow = StepPace(0.5, ceiling=4096)
    steps = prefill(slow, 8000, 1.0, 0.0, lambda p: 0.01)
    chunks = [chunk for chunk, _ in steps]
    assert chunks[:4] == [PROBE_TOKENS, 64, 128, 256]  # doubling up to what is owed
    assert all(b <= 2 * a for a, b in zip(chunks, chunks[1:], strict=False))
    total = sum(seconds for _, seconds in steps)
    assert total <= (1 + 1 / MIN_PREFILL_SHARE) * 80.0 + 0.5  # 80 s of prompt tokens
    assert max(chunks) <= 520  # 4 s of tokens beside each 1 s of decode: ~400, then less


def test_the_count_starts_again_when_no_prompt_waits() -> None:
    """A decode-only step ends a prefill: the next prompt's share is its own."""
    pace = StepPace(0.5, ceiling=4096)
    prefill(pace, 1000, 1.0, 0.0, lambda p: 0.01)
    pace.observe(0, decoding=True, seconds=1.0)
    assert (pace.steps, pace.seconds) == (0, 0.0)


def test_the_estimate_follows_steps_that_grow_dearer() -> None:
    """Later chunks of a long prompt attend over more keys: the chunk shrinks with them."""
    pace = StepPace(0.5, ceiling=512)
    pace.observe(100, decoding=False, seconds=0.5)  # 5 ms per token
    first = pace.chunk(decoding=True)
    pace.observe(first, decoding=True, seconds=first * 0.02)  # now 20 ms per token
    assert pace.chunk(decoding=True) < first


def test_the_chunk_stays_between_the_floor_and_the_budget() -> None:
    tiny = StepPace(0.5, ceiling=512)
    tiny.observe(0, decoding=True, seconds=0.001)
    tiny.observe(32, decoding=True, seconds=0.001 + 32 * 1.0)  # one token: a second
    assert tiny.chunk(decoding=True) == MIN_CHUNK  # the prompt still moves
    fast = StepPace(0.5, ceiling=512)
    fast.observe(512, decoding=False, seconds=0.0)  # a GPU: too fast to time
    assert fast.chunk(decoding=True) == 512
    with pytest.raises(ValueError, match="> 0 seconds"):
        StepPace(0.0, ceiling=512)


def test_a_step_with_a_large_fixed_cost_settles_at_the_target() -> None:
    """0.5 s of every step is fixed (not per token) beside a 0.1 s decode: per-token
    averages that spread it over the chunk still settle on the chunk that takes the 1.5 s
    target ((1.5 - 0.6) / 0.01 = 90 tokens), not one that believes the fixed part scales."""
    pace = StepPace(1.5, ceiling=512)
    steps = prefill(pace, 3000, 0.1, 0.5, lambda p: 0.01)
    assert all(abs(chunk - 90) <= 2 for chunk, _ in steps[-6:-1])
    assert all(seconds == pytest.approx(1.5, abs=0.02) for _, seconds in steps[-6:-1])


def test_a_noisy_fast_step_doubles_the_chunk_at_most() -> None:
    """A step that ran fast while the machine was briefly idle (10x cheaper tokens) lets
    the next chunk grow twofold, never to the whole budget."""
    pace = StepPace(1.0, ceiling=4096)
    steps = prefill(pace, 2000, 0.1, 0.0, lambda p: 0.01)
    chunks = [steps[-2][0]]
    for _ in range(3):
        pace.observe(chunks[-1], decoding=True, seconds=0.1)  # as fast as its decode alone
        chunks.append(pace.chunk(decoding=True, remaining=2000))
    assert chunks[1] > chunks[0] and all(
        b <= 2 * a for a, b in zip(chunks, chunks[1:], strict=False)
    )
    assert chunks[-1] < 4096
