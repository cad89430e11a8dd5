"""The graceful-closure policy: exact penalties on a hand-made table, and the guarantee that
it never allows a masked token nor removes an allowed one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gclm.compiler.tables import build_table
from gclm.masking import ConstraintState, allocate_bitmask, apply_bitmask, fill_bitmask
from gclm.masking.graceful import GracefulPolicy

EOS = 39


def chain_table():
    """0 -a-> 1 -b-> 2 (accepting); c and d loop in 0 and 1 ("string content"); e in 0 jumps
    to 2; f in 0 moves away, to 3 -g-> 1 ("an optional property"). Vocabulary of 40 (two
    mask words), EOS = 39."""
    a, b, c, d, e, f, g = 1, 2, 3, 4, 35, 6, 7
    edges = [(0, a, 1), (1, b, 2), (0, c, 0), (0, d, 0), (1, c, 1), (1, d, 1), (0, e, 2)]
    edges += [(0, f, 3), (3, g, 1)]
    arr = np.array(edges)
    return build_table(
        vocab_size=40,
        eos_token_id=EOS,
        initial=0,
        num_states=4,
        accepting=np.array([False, False, True, False]),
        src=arr[:, 0],
        tokens=arr[:, 1],
        dst=arr[:, 2],
    )


def tokens_of(table, sets, pens) -> dict[int, float]:
    return {
        int(t): float(p)
        for s, p in zip(sets, pens, strict=True)
        for t in table.token_sets.tokens_of(s)
    }


def test_lateral_tokens_that_eat_the_reserve_are_lowered():
    table = chain_table()  # min_tokens 1 (e)
    policy = GracefulPolicy(reserve=1.0, lateral_penalty=2.0, close_penalty=0.0)
    # Budget 5: 4 spare. In state 0 (dist 1) with 5 left, looping (c, d) leaves slack 3
    # against a target of 4 * min(1/1, 4/5) = 3.2: a shortfall of 0.2 each, and a (to 1,
    # dist 1) likewise. e (dist 0) closes; f (dist 2) moves away: never lowered.
    sets, pens, _ = policy.penalties(table, 0, 5, 5)
    assert tokens_of(table, sets, pens) == pytest.approx({1: 0.4, 3: 0.4, 4: 0.4})
    # Two tokens later (3 left, still in 0) the slack is 1 against 4 * 2/5 = 1.6.
    sets, pens, _ = policy.penalties(table, 0, 3, 5)
    assert tokens_of(table, sets, pens) == pytest.approx({1: 1.2, 3: 1.2, 4: 1.2})
    assert policy.penalties(table, 0, 1, 1)[0] == []  # no spare token at all


def test_closing_with_spare_tokens_unspent_is_lowered():
    table = chain_table()
    policy = GracefulPolicy(reserve=0.5, lateral_penalty=0.0, close_penalty=1.0, close_cap=1.5)
    # State 1 (dist 1) with 4 left, budget 5: staying leaves 3 - 1 = 2 spare tokens against
    # a target of 0.5 * 4 * min(1/1, 3/5) = 1.2, so 0.8 unspent: b (closing) pays 0.8. In
    # state 0, e closes (a is lateral there) and pays the same.
    sets, pens, _ = policy.penalties(table, 1, 4, 5)
    assert tokens_of(table, sets, pens) == pytest.approx({2: 0.8})
    sets, pens, _ = policy.penalties(table, 0, 4, 5)
    assert tokens_of(table, sets, pens) == pytest.approx({35: 0.8})
    # Where the only lateral tokens are blanks, there is no content to write: no penalty.
    blanks = GracefulPolicy(blank_ids=(3, 4), reserve=0.5, lateral_penalty=0.0)
    assert blanks.penalties(table, 1, 4, 5)[0] == []


def test_silent_where_the_budget_does_not_bite():
    table = chain_table()
    policy = GracefulPolicy(horizon=8)
    # Budget 64: every successor leaves 60 or more spare tokens, far beyond the horizon.
    sets, pens, blanks = policy.penalties(table, 0, 62, 64)
    assert sets == [] and not blanks
    # The last spare tokens of the same request are paced.
    sets, pens, blanks = policy.penalties(table, 1, 6, 64)
    assert sets and blanks


def test_blank_tokens_come_from_the_vocabulary():
    token_bytes = [None, b" ", b"\n\n", b" a", b"\t \r", b"", b"x"]
    assert GracefulPolicy.for_vocab(token_bytes).blank_ids == (1, 2, 4)


def reference(logits, table, state, left, budget, policy):
    """The policy token by token, from the table's transitions."""
    out = logits.clone()
    sets, pens, blanks = policy.penalties(table, state, left, budget)
    for token, pen in tokens_of(table, sets, pens).items():
        out[token] -= pen
    if blanks:
        out[list(policy.blank_ids)] -= policy.blank_penalty
    return out


@pytest.mark.parametrize("reserve", [0.0, 0.5, 1.0])
def test_adjust_matches_the_reference_and_keeps_the_allowed_set(reserve):
    table = chain_table()
    policy = GracefulPolicy(blank_ids=(3, 20), reserve=reserve, close_penalty=2.0)
    rng = np.random.default_rng(0)
    changed = 0
    for budget in range(table.min_tokens, 9):
        for state in range(table.num_states):
            for left in range(max(1, int(table.dist[state])), budget + 1):
                seq = ConstraintState(table)
                seq.state = state
                bitmask = allocate_bitmask(1, table.vocab_size)
                fill_bitmask(bitmask, 0, seq, left)
                logits = torch.tensor(rng.normal(size=(1, 48)), dtype=torch.float32)
                apply_bitmask(logits, bitmask)
                allowed = torch.isfinite(logits[0]).clone()
                expected = reference(logits[0], table, state, left, budget, policy)
                before = logits[0].clone()
                policy.adjust(logits[0], seq, left, budget)
                assert torch.equal(torch.isfinite(logits[0]), allowed)
                assert not torch.isnan(logits).any()
                torch.testing.assert_close(logits[0][allowed], expected[allowed])
                changed += not torch.equal(logits[0][allowed], before[allowed])
    assert changed > 10  # the policy did act, in many of these cases


def test_torch_rows_get_the_same_penalties_as_numpy_rows():
    # bfloat16 CPU rows have no numpy view: they take the torch indexing path (as on a GPU).
    table = chain_table()
    policy = GracefulPolicy(blank_ids=(3, 20), reserve=1.0, close_penalty=2.0)
    seq = ConstraintState(table)
    logits = torch.zeros(1, 40)
    bitmask = allocate_bitmask(1, table.vocab_size)
    fill_bitmask(bitmask, 0, seq, 4)
    apply_bitmask(logits, bitmask)
    half = logits.to(torch.bfloat16)
    policy.adjust(logits[0], seq, 4, 5)
    policy.adjust(half[0], seq, 4, 5)
    assert (logits[torch.isfinite(logits)] != 0).any()  # the policy did lower something
    torch.testing.assert_close(half.float(), logits, atol=0.02, rtol=0)


def test_policy_is_validated():
    with pytest.raises(ValueError, match="reserve"):
        GracefulPolicy(reserve=1.5)
    with pytest.raises(ValueError, match="close_penalty"):
        GracefulPolicy(close_penalty=float("inf"))
    with pytest.raises(ValueError, match="horizon"):
        GracefulPolicy(horizon=-1)
