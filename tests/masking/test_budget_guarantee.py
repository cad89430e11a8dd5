"""The guarantee: decoding with the masks always ends accepted, within the budget."""

from __future__ import annotations

import pytest
from dfa_strategies import decode, random_tables
from hypothesis import given, settings
from hypothesis import strategies as st

from gclm.errors import BudgetTooSmallError


def accepts(table, tokens: list[int]) -> bool:
    state = table.initial
    for t in tokens:
        toks, nxt = table.transitions(state)
        hit = [int(n) for tok, n in zip(toks, nxt, strict=True) if tok == t]
        if not hit:
            return False
        state = hit[0]
    return bool(table.accepting[state])


@settings(max_examples=200, deadline=None)
@given(
    table=random_tables(),
    extra=st.integers(0, 6),
    seed=st.integers(0, 2**31 - 1),
    greedy=st.booleans(),
    pad=st.sampled_from([0, 1, 31, 64]),
)
def test_output_is_accepted_within_budget(table, extra, seed, greedy, pad):
    budget = table.min_tokens + extra
    out, seq = decode(table, budget, seed=seed, greedy=greedy, logits_pad=pad)
    assert accepts(table, out)
    assert seq.is_accepting
    assert len(out) <= budget


@settings(max_examples=100, deadline=None)
@given(table=random_tables(), seed=st.integers(0, 2**31 - 1), greedy=st.booleans())
def test_tightest_budget_gives_exactly_min_tokens(table, seed, greedy):
    out, _ = decode(table, table.min_tokens, seed=seed, greedy=greedy)
    assert len(out) == table.min_tokens
    assert accepts(table, out)


@settings(max_examples=50, deadline=None)
@given(table=random_tables())
def test_budget_below_minimum_is_refused_up_front(table):
    if table.min_tokens == 0:
        return
    with pytest.raises(BudgetTooSmallError):
        decode(table, table.min_tokens - 1, seed=0, greedy=True)
