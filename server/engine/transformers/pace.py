"""Prefill chunks sized by time: while streams decode, no step outlasts its target.

A fixed token budget per step (`--max-num-batched-tokens`) bounds a step's positions, not
its seconds: 512 prompt tokens take a few milliseconds on a GPU and several seconds on two
CPU cores without AVX2, and every running stream waits that long for its next token.
`StepPace` learns what a step costs from the steps the engine runs, with two numbers,

    step seconds ~= decode + per_token * prefill tokens,

`decode` the cost of a step that only decodes the running rows and `per_token` what each
prompt token adds (it grows with the prompt's length, as attention reads more keys; the
moving averages follow). While rows are decoding, a step's prefill chunk is the number of
tokens that keeps it near `target_s`; with nothing decoding nobody waits, and the chunk is
the token budget's. The first chunk beside running streams, before any estimate, is
`PROBE_TOKENS`.

Two guards. Each step pays its decode part again, so a long prompt fed in chunks much
shorter than that part would take many times its unchunked time to its first token: the
prefill part of a step is kept at least `MIN_PREFILL_SHARE` times the decode part (on a
machine too slow or too loaded for the target, the gap gives way before the long prompt's
first token does). And a chunk at most doubles from one step to the next, so that one
noisy timing (a step that ran fast while the machine was briefly idle) cannot turn into a
chunk of the whole budget.
"""

from __future__ import annotations

# The first chunk fed beside running streams, before any prefill was timed.
PROBE_TOKENS = 32
# No chunk is smaller: below it the per-step costs outweigh the prefill.
MIN_CHUNK = 16
# Weight of the newest step in the moving averages.
ALPHA = 0.5
# A step's prefill part is at least this many times its decode part.
MIN_PREFILL_SHARE = 2.0


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

    def chunk(self, decoding: bool) -> int:
        """The most prompt tokens the next step may prefill; `decoding`: rows are running."""
        if self.target_s is None or not decoding:
            return self.ceiling
        if self.per_token_s is None:
            return min(PROBE_TOKENS, self.ceiling)
        decode, per_token = self.decode_s or 0.0, max(self.per_token_s, 1e-9)
        seconds = max(self.target_s - decode, MIN_PREFILL_SHARE * decode)
        fits = int(seconds / per_token + 1e-6)  # 0.4 / 0.01 is 39.99...
        if self.last_chunk:
            fits = min(fits, 2 * self.last_chunk)
        return min(self.ceiling, max(MIN_CHUNK, fits))

    def observe(self, prefill_tokens: int, decoding: bool, seconds: float) -> None:
        """Learn from a finished step: its prompt tokens, whether rows decoded in it, and
        its seconds."""
        if prefill_tokens == 0:
            if decoding:
                self.decode_s = _average(self.decode_s, seconds)
            return
        decode = (self.decode_s or 0.0) if decoding else 0.0
        if decoding:
            self.last_chunk = prefill_tokens
        spent = seconds - decode
        self.per_token_s = _average(self.per_token_s, max(spent, 0.0) / prefill_tokens)


def _average(old: float | None, new: float) -> float:
    return new if old is None else (1 - ALPHA) * old + ALPHA * new
