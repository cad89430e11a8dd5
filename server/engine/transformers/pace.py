"""Prefill chunks sized by time: while streams decode, no step outlasts its target.

A fixed token budget per step (`--max-num-batched-tokens`) bounds a step's positions, not
its seconds: 512 prompt tokens take a few milliseconds on a GPU and several seconds on two
CPU cores without AVX2, and every running stream waits that long for its next token.
`StepPace` learns what a step costs from the steps the engine runs, with three numbers,

    step seconds ~= decode + fixed + per_token * prefill tokens,

`decode` the cost of a step that only decodes the running rows (a moving average), `fixed`
what a prefill pass costs whatever its size (its own read of the weights, the mask and
keys of a long prompt: it grows with the prompt) and `per_token` what each prompt token
adds, the last two fitted by least squares over the last `WINDOW` steps that prefilled
beside decoding rows. Until their chunks differ enough to tell the two apart, all of it
is put down to the tokens (`per_token` alone, a moving average), and a chunk stuck at one
size tries half that size once to learn the difference (twice that size at the floor,
`MIN_CHUNK`). Never more: a steady pace is stuck by design, and a doubled chunk of a long
prompt is a step twice the target (measured: a 4k-token prompt beside six streams on 2
loaded cores, chunks 158 -> 316 -> 506 ran 2.0, 11.3 and 44.3 s, every stream frozen).

While rows are decoding, a step's prefill chunk is the number of tokens that keeps it near
`target_s`; with nothing decoding nobody waits, and the chunk is the token budget's. The
first chunk beside running streams, before any estimate, is `PROBE_TOKENS`.

Two guards. Each step pays its decode part again, so a long prompt fed in chunks much
shorter than that part would take many times its unchunked time to its first token: the
tokens' part of a step is kept at least `MIN_PREFILL_SHARE` times the rest (decode and
fixed costs), so the first token comes at most about 1.33 times later than unchunked; on
a machine too slow or too loaded for the target, the gap gives way before that does. And a
chunk at most doubles from one step to the next, so that one noisy timing (a step that ran
fast while the machine was briefly idle) cannot turn into a chunk of the whole budget.
"""

from __future__ import annotations

from collections import deque
from statistics import fmean

# The first chunk fed beside running streams, before any prefill was timed.
PROBE_TOKENS = 32
# No chunk is smaller: below it the per-step costs outweigh the prefill.
MIN_CHUNK = 16
# Weight of the newest step in the moving averages.
ALPHA = 0.5
# A step's prompt tokens take at least this many times the rest of the step.
MIN_PREFILL_SHARE = 3.0
# Steps that prefilled beside decoding rows, kept for the fit.
WINDOW = 8
# Chunks this far apart (largest over smallest) tell a pass's fixed cost from its tokens'.
SPREAD = 1.5


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
        # (prompt tokens, seconds past the decode part) of recent steps that did both.
        self.recent: deque[tuple[int, float]] = deque(maxlen=WINDOW)

    def chunk(self, decoding: bool) -> int:
        """The most prompt tokens the next step may prefill; `decoding`: rows are running."""
        if self.target_s is None or not decoding:
            return self.ceiling
        if self.per_token_s is None:
            return min(PROBE_TOKENS, self.ceiling)
        fit = self.fit()
        fixed, per_token = fit if fit is not None else (0.0, self.per_token_s)
        overhead = (self.decode_s or 0.0) + fixed
        seconds = max(self.target_s - overhead, MIN_PREFILL_SHARE * overhead)
        fits = int(seconds / max(per_token, 1e-9) + 1e-6)  # 0.4 / 0.01 is 39.99...
        if self.last_chunk:
            if len(self.recent) == WINDOW and self._alike():  # stuck: try another size once
                half = self.last_chunk // 2
                fits = half if half >= MIN_CHUNK else 2 * self.last_chunk
            else:
                fits = min(fits, 2 * self.last_chunk)
        return min(self.ceiling, max(MIN_CHUNK, fits))

    def _alike(self) -> bool:
        """Whether the recent chunks are too alike (the largest under SPREAD times the
        smallest) to tell a pass's fixed cost from its tokens'."""
        chunks = [c for c, _ in self.recent]
        return max(chunks) < SPREAD * min(chunks)

    def fit(self) -> tuple[float, float] | None:
        """(fixed, per_token) seconds by least squares over the recent steps, or None while
        their chunks are too alike to tell the two apart (or the fit makes no sense)."""
        if len(self.recent) < 3 or self._alike():
            return None
        chunks = [c for c, _ in self.recent]
        spent = [y for _, y in self.recent]
        mc, my = fmean(chunks), fmean(spent)
        spread = sum((c - mc) ** 2 for c in chunks)
        slope = sum((c - mc) * (y - my) for c, y in zip(chunks, spent, strict=True)) / spread
        if slope <= 0:
            return None
        return max(my - slope * mc, 0.0), slope

    def observe(self, prefill_tokens: int, decoding: bool, seconds: float) -> None:
        """Learn from a finished step: its prompt tokens, whether rows decoded in it, and
        its seconds."""
        if prefill_tokens == 0:
            if decoding:
                self.decode_s = _average(self.decode_s, seconds)
            return
        decode = (self.decode_s or 0.0) if decoding else 0.0
        spent = seconds - decode
        if decoding:
            self.last_chunk = prefill_tokens
            self.recent.append((prefill_tokens, max(spent, 0.0)))
        self.per_token_s = _average(self.per_token_s, max(spent, 0.0) / prefill_tokens)


def _average(old: float | None, new: float) -> float:
    return new if old is None else (1 - ALPHA) * old + ALPHA * new
