"""What a sequence masks with: one protocol over the whole table's masks and the lazy ones.

Two kinds of source implement it:

- `MaskTable` (masking/masks.py): a whole CompiledTable's rows, every state's distance known
  (compiled by a worker: compiler/whole/).
- `LazyTable` (compiler/grown/lazy_table.py): a constraint's masks walked state by state as
  generation reaches them, distances bounded and searched exactly where a budget needs it.

A sequence's state (masking/state.py), the drafts, the bitmask fill and the logits
processors read only this protocol; `mask_source` (masking/masks.py) makes one of a table.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class MaskSource(Protocol):
    """The masks of one constraint over one vocabulary, state by state.

    States are ints; `initial` is where every output starts. A row is int32 [W] (`width`
    words, bit `v % 32` of word `v // 32` for token v), read-only.
    """

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_id(self) -> int: ...

    @property
    def width(self) -> int:
        """int32 words in a row."""
        ...

    @property
    def initial(self) -> int: ...

    def forward_row(self, state: int) -> np.ndarray:
        """Every token with a transition from `state`, EOS if it accepts."""
        ...

    def row(self, state: int, tokens_left: int) -> np.ndarray:
        """The tokens allowed in `state` with `tokens_left` left (counting the one about to
        be sampled; EOS is free): those whose successor still reaches acceptance in time.
        Raises InternalError when none is (the budget was not checked)."""
        ...

    def next_state(self, state: int, token: int) -> int:
        """The state `token` leads to from `state`, or -1 where it is not allowed (EOS: -1)."""
        ...

    def is_accepting(self, state: int) -> bool: ...

    def has_tokens(self, state: int) -> bool:
        """Whether any non-EOS token leaves `state`."""
        ...

    def fits(self, state: int, k: int) -> bool:
        """Whether `state` reaches acceptance in at most `k` tokens."""
        ...

    def dist(self, state: int) -> int:
        """The fewest tokens from `state` to acceptance."""
        ...

    def upper_bound(self, state: int) -> int:
        """A cheap upper bound on `dist(state)` (the distance itself where it is known)."""
        ...

    def request_fits(self, budget: int) -> bool:
        """Whether an output fits in `budget` tokens, as a request's way in asks it (a lazy
        source bounds its search: compiler/grown/lazy_table.py's SearchTooLarge)."""
        ...

    def request_minimum(self) -> int:
        """The fewest tokens of any output, as a request's way in asks it (bounded as
        `request_fits`)."""
        ...
