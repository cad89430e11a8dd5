"""A reasoning phase before the constraint: think freely, then an answer that still fits.

A reasoning model writes its thinking, an end marker (`</think>`: one special token, or
several plain-text tokens), and then the answer. `ReasoningState` is a ConstraintState with
that phase in front: while thinking, any token but the end-of-sequence ones may be sampled,
as long as the budget can still hold the rest of the marker and the answer's shortest output;
once the marker's last token is sampled, the constraint applies from its initial state.

The budget, exactly. Let `L` be the marker's length in tokens, `m` how many of its tokens the
thinking so far ends with (the longest such prefix: a model that writes the marker itself
closes its thinking), `close(m) = L - m` the tokens that still close it, and `d0` the
answer's fewest tokens (`table.min_tokens`). With `r` tokens left, counting the one being
sampled, token `v` (leading to `m'`) may be sampled while thinking iff

    close(m') + d0 <= r - 1

and, with a thinking cap of `cap` tokens (`thinking_token_budget`: the thinking before the
marker; the marker itself is not counted) after `n` tokens of thinking,

    close(m') <= cap + L - n - 1.

Both say the same thing: after `v`, the marker and the answer (or the marker within the cap)
still fit. When every token but the marker's next one would break them, only that one is
allowed: the close is forced, token by token, and the answer starts with exactly its
minimum left (or more, under a cap). A request needs `L + d0` tokens at least
(`check_budget(..., thinking=spec)`), which holds `r - 1 >= close(0) + d0` at the first
step; each step keeps it, so a row is never empty.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from gclm.compiler import CompiledTable
from gclm.errors import InternalError
from gclm.masking.masks import num_words, set_bit
from gclm.masking.state import ConstraintState


@dataclass(frozen=True)
class ThinkingSpec:
    """How one request thinks: its end marker's token ids, and an optional cap."""

    end_ids: tuple[int, ...]  # the end marker (`</think>`) as the model spells it
    cap: int | None = None  # most thinking tokens before the marker (None: the budget's)

    def __post_init__(self) -> None:
        if not self.end_ids:
            raise ValueError("The end-of-thinking marker must have at least one token.")
        if self.cap is not None and self.cap < 0:
            raise ValueError(f"The thinking cap must be >= 0, got {self.cap}.")

    def min_tokens(self, table: CompiledTable) -> int:
        """The fewest tokens a request thinking this way needs: the marker plus the answer's
        shortest output."""
        return len(self.end_ids) + table.min_tokens


def _failure(ids: Sequence[int]) -> list[int]:
    """KMP failure function: fail[i] is the longest proper prefix of ids[:i + 1] that is
    also its suffix."""
    fail = [0] * len(ids)
    k = 0
    for i in range(1, len(ids)):
        while k and ids[i] != ids[k]:
            k = fail[k - 1]
        if ids[i] == ids[k]:
            k += 1
        fail[i] = k
    return fail


def _step(ids: Sequence[int], fail: Sequence[int], matched: int, token: int) -> int:
    """How many marker tokens the text ends with after `token`, when it ended with
    `matched` of them (one KMP step)."""
    while matched and ids[matched] != token:
        matched = fail[matched - 1]
    return matched + 1 if ids[matched] == token else 0


class ThinkingWatch:
    """Where an unmasked sequence (no constraint) stands in its thinking: the same marker
    tracking as ReasoningState, without a mask (the model closes when it likes)."""

    __slots__ = ("end_ids", "thinking", "matched", "thinking_tokens", "_fail")

    def __init__(self, end_ids: Sequence[int]) -> None:
        self.end_ids = tuple(end_ids)
        self.thinking = True
        self.matched = 0
        self.thinking_tokens = 0
        self._fail = _failure(self.end_ids)

    def advance(self, token_id: int, tokens_left: int | None = None) -> None:
        """Take one token; thinking ends with the marker's last one."""
        if not self.thinking:
            return
        self.thinking_tokens += 1
        self.matched = _step(self.end_ids, self._fail, self.matched, token_id)
        if self.matched == len(self.end_ids):
            self.thinking = False


@lru_cache(maxsize=16)
def _free_row(vocab_size: int, banned: frozenset[int]) -> np.ndarray:
    """int32 [W]: every token id below `vocab_size` except `banned` (read-only, shared)."""
    row = np.full(num_words(vocab_size), -1, dtype=np.int32)
    words = row.view(np.uint32)
    tail = vocab_size % 32
    if tail:
        words[-1] = np.uint32((1 << tail) - 1)  # bits past the last id name no token
    for token in banned:
        words[token >> 5] &= ~np.uint32(1 << (token & 31))
    row.flags.writeable = False
    return row


class ReasoningState(ConstraintState):
    """A ConstraintState with a thinking phase before its constraint (module docstring).

    While `thinking`, `state` stays the table's initial state and `num_tokens` at 0;
    `thinking_tokens` counts the tokens of the phase, the end marker included.
    """

    __slots__ = ("spec", "banned", "thinking", "matched", "thinking_tokens", "_fail", "_row")

    def __init__(
        self,
        table: CompiledTable,
        spec: ThinkingSpec,
        budget_aware: bool = True,
        banned: Iterable[int] = (),
    ) -> None:
        super().__init__(table, budget_aware)
        self.spec = spec
        # EOS (and the engine's other stop ids) would end the output before its answer.
        self.banned = frozenset({table.eos_token_id, *banned})
        if any(t in self.banned for t in spec.end_ids):
            raise ValueError("The end-of-thinking marker contains an end-of-sequence token.")
        if not all(0 <= t < table.vocab_size for t in spec.end_ids):
            raise ValueError("The end-of-thinking marker has token ids outside the vocabulary.")
        self.thinking = True  # type: ignore[misc]  # this class's slot, over the property
        self.matched = 0  # marker tokens the thinking ends with
        self.thinking_tokens = 0
        self._fail = _failure(spec.end_ids)
        self._row = np.zeros(self.masks.width, dtype=np.int32)

    def __repr__(self) -> str:
        if not self.thinking:
            return super().__repr__()
        return (
            f"ReasoningState(thinking, matched={self.matched}/{len(self.spec.end_ids)}, "
            f"thinking_tokens={self.thinking_tokens})"
        )

    @property
    def is_accepting(self) -> bool:
        return not self.thinking and super().is_accepting

    @property
    def dist(self) -> int:
        """Fewest further tokens that reach acceptance: while thinking, the rest of the
        marker plus the answer's minimum."""
        if self.thinking:
            return len(self.spec.end_ids) - self.matched + self.masks.request_minimum()
        return super().dist

    def must_stop(self, tokens_left: int) -> bool:
        return not self.thinking and super().must_stop(tokens_left)

    def after(self, token: int) -> int:
        """How many marker tokens the thinking ends with after `token` (KMP step)."""
        return _step(self.spec.end_ids, self._fail, self.matched, token)

    def slack(self, tokens_left: int | None) -> int:
        """The most tokens the marker may still take after the next token (the module
        docstring's bounds): the budget's and the cap's, whichever is smaller."""
        ends = len(self.spec.end_ids)
        limit = ends  # nothing binds: any token
        if self.budget_aware and tokens_left is not None:
            limit = min(limit, tokens_left - 1 - self.masks.request_minimum())
        if self.spec.cap is not None:
            limit = min(limit, self.spec.cap + ends - self.thinking_tokens - 1)
        return limit

    def allowed_row(self, tokens_left: int | None) -> np.ndarray:
        if not self.thinking:
            return super().allowed_row(tokens_left)
        ends = len(self.spec.end_ids)
        slack = self.slack(tokens_left)
        if slack >= ends:
            return _free_row(self.masks.vocab_size, self.banned)
        # Only marker tokens can shorten the close: allow those that leave it within slack.
        row = self._row
        row.fill(0)
        for token in set(self.spec.end_ids):
            if ends - self.after(token) <= slack:
                set_bit(row, token)
        if not row.any():
            raise InternalError(
                f"No token is allowed while thinking: {tokens_left} tokens left cannot hold "
                f"the end marker's last {ends - self.matched} tokens and the answer's "
                f"{self.masks.request_minimum()}: check_budget(..., thinking=...) did not run."
            )
        return row

    def advance(self, token_id: int, tokens_left: int | None = None) -> None:
        if not self.thinking:
            super().advance(token_id, tokens_left)
            return
        if token_id in self.banned or not 0 <= token_id < self.masks.vocab_size:
            raise InternalError(f"Token {token_id} sampled while thinking: the mask bans it.")
        nxt = self.after(token_id)
        if len(self.spec.end_ids) - nxt > self.slack(tokens_left):
            raise InternalError(
                f"Token {token_id} leaves {len(self.spec.end_ids) - nxt} end-marker tokens to "
                f"write with {tokens_left} tokens left: it was sampled outside the mask."
            )
        self.thinking_tokens += 1
        self.matched = nxt
        if nxt == len(self.spec.end_ids):
            self.thinking = False  # type: ignore[misc]  # the answer starts at the initial state
