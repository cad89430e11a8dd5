"""mask_rows, the one mask-apply step of every engine: each row masked to what its state
allows (every token for a free row), then the policy of budget-aware rows only."""

from __future__ import annotations

import torch
from dfa_strategies import table_from_edges

from gclm.masking import ConstraintState, allocate_bitmask
from gclm.masking.apply import MaskRow, mask_rows

VOCAB = 40
EOS = 39


class Recording:
    """A BudgetPolicy that lowers token 0 by 1 and remembers what it was called with."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def adjust(self, logits, state, tokens_left: int, budget: int) -> None:
        self.calls.append((tokens_left, budget))
        logits[0] -= 1.0


def test_rows_are_masked_then_only_budget_aware_rows_get_their_policy() -> None:
    # Tokens 0, 31 and 32 lead from state 0 to the accepting state 1.
    table = table_from_edges(VOCAB, EOS, 2, [1], [(0, 0, 1), (0, 31, 1), (0, 32, 1)])
    policy = Recording()
    rows = [
        MaskRow(ConstraintState(table), 3, 8, policy),
        MaskRow.free(),
        MaskRow(ConstraintState(table, budget_aware=False), None, 8, policy),
    ]
    logits = torch.zeros(3, VOCAB + 8)  # the model pads its output layer past the vocabulary
    mask_rows(logits, allocate_bitmask(4, VOCAB), rows, VOCAB)
    allowed = [set(torch.nonzero(torch.isfinite(r)).flatten().tolist()) for r in logits]
    assert allowed == [{0, 31, 32}, set(range(VOCAB)), {0, 31, 32}]
    assert policy.calls == [(3, 8)]  # the forward-only row is left to the mask
    assert logits[0, 0] == -1.0 and logits[2, 0] == 0.0
