"""StepPace: prefill chunks sized from timed steps so that running streams wait about the
target per step, and the token budget alone when nothing decodes."""

from __future__ import annotations

import pytest

from gclm.server.engine.transformers.pace import MIN_CHUNK, PROBE_TOKENS, WINDOW, StepPace


def test_nothing_decoding_or_no_target_means_the_token_budget() -> None:
    pace = StepPace(0.5, ceiling=512)
    assert pace.chunk(decoding=False) == 512
    assert StepPace(None, ceiling=512).chunk(decoding=True) == 512


def test_a_probe_first_then_the_chunk_that_fits_the_target() -> None:
    pace = StepPace(0.5, ceiling=512)
    assert pace.chunk(decoding=True) == PROBE_TOKENS
    pace.observe(0, decoding=True, seconds=0.1)  # a decode-only step: 0.1 s
    pace.observe(32, decoding=True, seconds=0.1 + 32 * 0.01)  # 10 ms per prompt token
    assert pace.decode_s == pytest.approx(0.1) and pace.per_token_s == pytest.approx(0.01)
    assert pace.chunk(decoding=True) == 40  # (0.5 - 0.1) / 0.01
    assert pace.chunk(decoding=False) == 512


def test_the_estimate_follows_steps_that_grow_dearer() -> None:
    """Later chunks of a long prompt attend over more keys: the chunk shrinks with them."""
    pace = StepPace(0.5, ceiling=512)
    pace.observe(100, decoding=False, seconds=0.5)  # 5 ms per token
    first = pace.chunk(decoding=True)
    pace.observe(first, decoding=True, seconds=first * 0.02)  # now 20 ms per token
    assert pace.chunk(decoding=True) < first


def test_a_step_too_slow_for_the_target_keeps_the_prefill_moving() -> None:
    """Decoding alone outlasts the target: the prefill part still gets three times the
    decode part (the long prompt's first token is not put off without end), growing at
    most twofold per step."""
    slow = StepPace(0.5, ceiling=512)
    slow.observe(0, decoding=True, seconds=1.0)
    slow.observe(16, decoding=True, seconds=1.0 + 16 * 0.01)
    assert slow.chunk(decoding=True) == 32  # 3.0 s of prefill is 300 tokens; doubling: 32
    slow.observe(32, decoding=True, seconds=1.0 + 32 * 0.01)
    slow.observe(64, decoding=True, seconds=1.0 + 64 * 0.01)
    slow.observe(128, decoding=True, seconds=1.0 + 128 * 0.01)
    assert slow.chunk(decoding=True) == 256
    slow.observe(256, decoding=True, seconds=1.0 + 256 * 0.01)
    assert slow.chunk(decoding=True) == 300


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


def test_a_prefill_pass_fixed_cost_is_told_from_its_tokens() -> None:
    """Chunks of 16 to 128 at 0.5 s + 10 ms a token past a 0.1 s decode: the fit finds
    both, and the chunk gives the tokens three times the rest of the step (0.6 -> 1.8 s)."""
    pace = StepPace(0.5, ceiling=512)
    pace.observe(0, decoding=True, seconds=0.1)
    for chunk in (16, 32, 64, 128):
        pace.observe(chunk, decoding=True, seconds=0.1 + 0.5 + 0.01 * chunk)
    fixed, per_token = pace.fit()  # type: ignore[misc]
    assert fixed == pytest.approx(0.5) and per_token == pytest.approx(0.01)
    assert pace.chunk(decoding=True) == 180


def test_a_chunk_stuck_at_the_floor_tries_twice_that_once() -> None:
    pace = StepPace(0.5, ceiling=512)
    pace.observe(0, decoding=True, seconds=0.3)
    for _ in range(WINDOW):
        pace.observe(16, decoding=True, seconds=1.0)  # all alike: no fit
    assert pace.fit() is None and pace.chunk(decoding=True) == 32
    pace.observe(32, decoding=True, seconds=1.2)
    assert pace.fit() is not None  # the chunks differ now: no second try
    assert pace.chunk(decoding=True) <= 64


def test_a_steady_chunk_tries_half_its_size_never_more() -> None:
    """A pace that found its chunk is stuck by design: to tell the fixed cost from the
    tokens' it tries a smaller chunk, since a larger one is a step past the target for
    every running stream (it once doubled 158 -> 316 -> 506 tokens: 2, 11 and 44 s)."""
    pace = StepPace(1.0, ceiling=512)
    pace.observe(0, decoding=True, seconds=0.3)
    sizes = []
    for _ in range(3 * WINDOW):
        chunk = pace.chunk(decoding=True)
        sizes.append(chunk)
        pace.observe(chunk, decoding=True, seconds=0.3 + 0.1 + 0.004 * chunk)
    steady = sizes[WINDOW:]
    assert max(steady) <= 2 * min(s for s in steady if s > MIN_CHUNK)
    assert any(b == a // 2 for a, b in zip(sizes, sizes[1:], strict=False))  # the one try
    for a, b in zip(sizes, sizes[1:], strict=False):
        assert b <= 2 * a


@pytest.mark.parametrize("chunk", [40, 158, 250])
def test_a_stuck_chunk_is_never_doubled(chunk: int) -> None:
    pace = StepPace(1.0, ceiling=512)
    pace.observe(0, decoding=True, seconds=0.3)
    for _ in range(WINDOW):
        pace.observe(chunk, decoding=True, seconds=0.3 + 0.7)
    assert pace.fit() is None
    assert pace.chunk(decoding=True) == chunk // 2
