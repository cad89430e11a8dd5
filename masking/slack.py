"""Spread a budget's slack over the whole output instead of spending it all up front.

Budget-aware masking allows every token whose successor can still finish within the tokens
left. With `r` tokens left in state `s`, the token to `n` leaves the slack
`r - 1 - dist[n]`: tokens the output may still spend beyond its shortest completion. A model
that likes long strings spends all of it on the first string and is then forced into the
shortest closure for everything after it (empty strings, minimal arrays).

`spread_slack` is a soft policy on top of the mask. With budget `B`, `d0 = dist[initial]`
and `S0 = B - d0`, it keeps a reserve of slack for what is still ahead,

    reserve * S0 * min(dist[n] / d0, (r - 1) / B)

the smaller of two even schedules: one by structure (the share of the shortest output
still to write) and one by time (the share of the budget still to spend). A lateral token
(one whose successor is as far from acceptance as the current state: string content,
digits, a blank) that leaves less slack than that has its logit lowered by `penalty` per
token of shortfall. Tokens that move away from acceptance (opening an optional property or
another array item) are left alone: they are the model's choice of content, and
penalising their one-off cost closes objects of optional properties at once. Likewise the
time schedule: where `d0` is tiny (`{}`), the structure schedule alone would keep nearly
all the slack in reserve.

The policy only adds finite amounts to logits, so it never allows a masked token (-inf
stays -inf) and never removes an allowed one: the budget guarantee is the mask's,
unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from gclm.compiler.tables import CompiledTable
from gclm.masking.state import ConstraintState


@dataclass(frozen=True)
class SlackPolicy:
    """How hard to hold slack back for the rest of the output.

    reserve: fraction (0..1) of the evenly spread slack kept for what is still ahead.
    penalty: logit penalty per token of reserve that a successor would eat into.
    """

    reserve: float = 0.8
    penalty: float = 1.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.reserve <= 1.0:
            raise ValueError(f"reserve must be between 0 and 1, got {self.reserve}.")
        if not (math.isfinite(self.penalty) and self.penalty >= 0.0):
            raise ValueError(f"penalty must be a finite number >= 0, got {self.penalty}.")

    def adjust(
        self, logits: torch.Tensor, state: ConstraintState, tokens_left: int, budget: int
    ) -> None:
        """masking.policy.BudgetPolicy: `spread_slack` on one row."""
        spread_slack(logits, state.table, state.state, tokens_left, budget, self)


def slack_penalties(
    table: CompiledTable, state: int, tokens_left: int, budget: int, policy: SlackPolicy
) -> tuple[np.ndarray, np.ndarray]:
    """(mask rows, penalties) for the lateral successor groups of `state` that eat into the
    reserve.

    Args:
        table: the sequence's compiled table.
        state: its DFA state.
        tokens_left: tokens left, counting the one about to be sampled.
        budget: the request's max_tokens (the slack is spread over this whole budget).
    Returns:
        int32 [K] sets of `table.token_sets` and float64 [K] penalties (> 0), one per group.
    """
    d0 = table.min_tokens
    spare = budget - d0
    if d0 <= 0 or spare <= 0 or policy.penalty == 0.0:
        return np.zeros(0, np.int32), np.zeros(0, np.float64)
    nexts, rows = table.groups(state)
    dist_next = table.dist[nexts].astype(np.float64)  # [G_s]
    slack_after = tokens_left - 1 - dist_next
    ahead = np.minimum(dist_next / d0, (tokens_left - 1) / budget)
    shortfall = policy.reserve * spare * ahead - slack_after
    lateral = dist_next == table.dist[state]
    # Groups the mask removes (slack_after < 0) need no penalty: their logits are -inf.
    hit = lateral & (shortfall > 0) & (slack_after >= 0)
    return rows[hit].astype(np.int32), policy.penalty * shortfall[hit]


def spread_slack(
    logits: torch.Tensor,
    table: CompiledTable,
    state: int,
    tokens_left: int,
    budget: int,
    policy: SlackPolicy,
) -> None:
    """Lower, in place, the logits [V_logits] of tokens that would eat into the reserve.

    Call it after the mask is applied. Tokens of one state lead to exactly one successor, so
    the groups are disjoint and each token is penalised at most once.
    """
    rows, penalties = slack_penalties(table, state, tokens_left, budget, policy)
    for row, amount in zip(rows.tolist(), penalties.tolist(), strict=True):
        tokens = table.token_sets.tokens_of(row)
        tokens = torch.from_numpy(tokens[tokens < logits.shape[0]].astype(np.int64))
        logits[tokens.to(logits.device)] -= amount
