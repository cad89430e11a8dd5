"""Prefill chunks sized by time: while streams decode, no step outlasts its target.

A fixed token budget per step (`--max-num-batched-tokens`) bounds a step's positions, not
its seconds: 512 prompt tokens take a few milliseconds on a GPU and several seconds on two
CPU cores without AVX2, and every running stream waits that long for its next token.
`StepPace` learns what a step costs from the steps the engine runs, with two moving
averages: `decode`, what a step that only decodes the running rows takes, and
`per_token`, what each prompt token of a step beside them took past that part, the step's
fixed costs (its own read of the weights, the keys of a long prompt) spread over its
tokens. While rows are decoding, a step's chunk is what the target leaves past `decode`,
at `per_token` each: a ratio of measured seconds, so it settles where steps take the
target whatever the split between fixed and per-token costs (a chunk too small for it
carries a larger share of the fixed costs per token and is followed by a larger one). With
nothing decoding nobody waits, and the chunk is the token budget's. The first chunk beside
running streams, before any estimate, is `PROBE_TOKENS`. (A least-squares fit of fixed
and per-token costs used to size chunks; over chunks at rising positions of a long prompt,
each token dearer than the last, it took a dearer token for a cheaper one and doubled
chunks into steps of 2-3 s.)

Two guards. Each step pays its decode part again, so a long prompt fed in chunks much
shorter than that part would take many times its unchunked time to its first token. The
guard counts the whole prefill, not each step: the steps beside decoding rows since
prefilling began, and as many more of the next chunk's size as the prompt tokens left
take, must leave the prompt's tokens `MIN_PREFILL_SHARE` times the decode parts, so the
first token comes at most about 1.25 times later than unchunked; on a machine too slow or
too loaded for the target, the gap gives way before that does. Counted whole, a long
prompt's early chunks, whose tokens attend over few keys and take most of their step,
pay for its last ones, dearer per token beside the same decode: per step, the guard held
the steps near a 4k-token prompt's end at 1.3-1.6 s on 2 cores. And a chunk at most
doubles from one step to the next, so that one noisy timing (a step that ran fast while
the machine was briefly idle) cannot turn into a chunk of the whole budget (measured
before this cap: a 4k-token prompt beside six streams on 2 loaded cores, chunks 158 ->
316 -> 506 ran 2.0, 11.3 and 44.3 s, every stream frozen).
"""

from __future__ import annotations

import math

# The first chunk fed beside running streams, before any prefill was timed.
PROBE_TOKENS = 32
# No chunk is smaller: below it the per-step costs outweigh the prefill.
MIN_CHUNK = 16
# Weight of the newest step in the moving averages.
ALPHA = 0.5
# Prompt tokens take at least this many times the decode parts of the steps they share
# with decoding rows, counted over the whole prefill.
MIN_PREFILL_SHARE = 4.0


class StepPace:
    """Sizes each step's prefill chunk (module docstring)."""

    def __init__(self, target_s: float | None, ceiling: int) -> None:
        """`target_s`: seconds a step with running streams should take (None: no target,
        every chunk is `ceiling`); `ceiling`: the token budget of one step."""
        if target_s is not None and target_s <= 0:
            raise ValueError(f"The step target must be > 0 seconds, got {target_s}.")
        self.target_s = target_s
        self.ceiling = ceiling
        self.decode_s: float | None = None  # a decode-only step's seconds
        self.per_token_s: float | None = None  # seconds one prompt token adds to a step
        self.last_chunk = 0  # prompt tokens of the last step that decoded beside a prefill
        # The steps beside decoding rows since prefilling began, and their seconds.
        self.steps = 0
        self.seconds = 0.0

    def chunk(self, decoding: bool, remaining: int | None = None) -> int:
        """The most prompt tokens the next step may prefill; `decoding`: rows are running;
        `remaining`: the prompt tokens still to prefill (None: unknown; the count must
        hold after this one step)."""
        if self.target_s is None or not decoding:
            return self.ceiling
        if self.per_token_s is None:
            return min(PROBE_TOKENS, self.ceiling)
        per_token = max(self.per_token_s, 1e-9)
        fits = int((self.target_s - (self.decode_s or 0.0)) / per_token + 1e-6)  # 39.99...
        fits = max(fits, self._owed(per_token, remaining))
        if self.last_chunk:
            fits = min(fits, 2 * self.last_chunk)
        return min(self.ceiling, max(MIN_CHUNK, fits))

    def _owed(self, per_token: float, remaining: int | None) -> int:
        """The smallest chunk that keeps the prompt's share (module docstring): of the
        steps so far and, for `remaining` tokens, the steps of that chunk still to come."""
        decode = self.decode_s or 0.0
        rest = self.steps * decode
        prompt = self.seconds - rest
        if remaining is None:
            return int((MIN_PREFILL_SHARE * (rest + decode) - prompt) / per_token + 1e-6)
        spare = prompt + remaining * per_token - MIN_PREFILL_SHARE * rest
        if spare <= 0:
            return self.ceiling
        return math.ceil(MIN_PREFILL_SHARE * decode * remaining / spare - 1e-9)

    def observe(self, prefill_tokens: int, decoding: bool, seconds: float) -> None:
        """Learn from a finished step: its prompt tokens, whether rows decoded in it, and
        its seconds."""
        if prefill_tokens == 0:
            if decoding:
                self.decode_s = _average(self.decode_s, seconds)
                self.steps, self.seconds = 0, 0.0  # no prompt waits: a new count
            return
        decode = (self.decode_s or 0.0) if decoding else 0.0
        if decoding:
            self.last_chunk = prefill_tokens
            self.steps += 1
            self.seconds += seconds
        spent = max(seconds - decode, 0.0)
        self.per_token_s = _average(self.per_token_s, spent / prefill_tokens)


def _average(old: float | None, new: float) -> float:
    return new if old is None else (1 - ALPHA) * old + ALPHA * new
