"""Drafts: the tokens a constraint forces next, proposed so the engine can check them in one
forward pass instead of one pass each.

Where every token the mask allows from a state spells a prefix of one string (a fixed key,
`": "`, a closing `"}`), the text ahead is forced and only its tokenization is open. The draft
takes the longest allowed token, follows it, and repeats while the text stays forced and the
budget allows each token. The engine feeds the drafts with the row's last token; a draft is
kept only when the row samples it itself from the logits before it, so outputs are those of
stepping one token at a time (the same tokens for the same logits and seeds), and a forward
pass yields as many tokens as the row's samples agree with the drafts, plus one.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from gclm.masking.state import ConstraintState

if TYPE_CHECKING:
    from gclm.masking.source import MaskSource

# A state allowing more tokens than this is not forced (the test unpacks its row).
MAX_CHAIN_TOKENS = 64
_NONE = -1


class Drafter:
    """Drafts for one vocabulary; per state results are cached beside each MaskTable."""

    def __init__(self, token_bytes: Sequence[bytes | None]) -> None:
        self.token_bytes = token_bytes
        self._chains: weakref.WeakKeyDictionary[MaskSource, dict[int, int]] = (
            weakref.WeakKeyDictionary()
        )

    def draft(self, state: ConstraintState, tokens_left: int, limit: int) -> list[int]:
        """Up to `limit` tokens the constraint forces after `state`, each leaving enough of
        the `tokens_left` budget (counting the first draft) to finish."""
        if state.thinking:  # free text: nothing is forced (a forced close is one token a step)
            return []
        masks, s = state.masks, state.state
        out: list[int] = []
        left = tokens_left if state.budget_aware else 1 << 30
        while len(out) < limit and left > 0 and not state.finished:
            token = self.chain_token(masks, s)
            if token == _NONE:
                break
            nxt = masks.next_state(s, token)
            if nxt < 0 or not masks.fits(nxt, left - 1):
                break
            out.append(token)
            s, left = nxt, left - 1
        return out

    def chain_token(self, masks: MaskSource, state: int) -> int:
        """The longest token allowed from `state` when every allowed token spells a prefix of
        it (EOS not allowed), else -1."""
        chains = self._chains.get(masks)
        if chains is None:
            chains = self._chains[masks] = {}
        token = chains.get(state)
        if token is None:
            token = chains[state] = self._chain(masks, state)
        return token

    def _chain(self, masks: MaskSource, state: int) -> int:
        if masks.is_accepting(state):  # EOS competes with every token
            return _NONE
        row = masks.forward_row(state)
        if int(np.bitwise_count(row.view(np.uint32)).sum()) > MAX_CHAIN_TOKENS:
            return _NONE
        bits = np.unpackbits(row.view(np.uint8), bitorder="little")
        tokens = np.flatnonzero(bits).tolist()
        spelled = [(self.token_bytes[t] or b"", t) for t in tokens]
        if not spelled:
            return _NONE
        longest, token = max(spelled, key=lambda p: (len(p[0]), -p[1]))
        if not longest or any(not longest.startswith(b) for b, _ in spelled):
            return _NONE
        return token
