"""ConstraintState: advancing through the CSR rows, EOS, and when a sequence must stop."""

from __future__ import annotations

import pytest
from dfa_strategies import table_from_edges

from gclm.errors import BudgetTooSmallError, InternalError
from gclm.masking import ConstraintState, check_budget

A, B, EOS = 0, 1, 2


@pytest.fixture
def b_or_ab():
    """Language {"b", "ab"} over tokens a=0, b=1, EOS=2."""
    return table_from_edges(3, EOS, 3, [2], [(0, A, 1), (0, B, 2), (1, B, 2)])


@pytest.fixture
def a_plus():
    """Language a+ over tokens a=0, b=1, EOS=2."""
    return table_from_edges(3, EOS, 2, [1], [(0, A, 1), (1, A, 1)])


def test_advance_follows_transitions(b_or_ab):
    seq = ConstraintState(b_or_ab)
    assert seq.state == b_or_ab.initial and not seq.is_accepting and seq.dist == 1
    seq.advance(A)
    assert seq.state == 1 and seq.num_tokens == 1
    seq.advance(B)
    assert seq.is_accepting and not seq.finished
    seq.advance(EOS)
    assert seq.finished and seq.num_tokens == 2


def test_disallowed_token_raises(b_or_ab):
    seq = ConstraintState(b_or_ab)
    seq.advance(A)
    with pytest.raises(InternalError, match="Token 0 is not allowed in state 1"):
        seq.advance(A)
    assert seq.state == 1  # unchanged


def test_eos_outside_acceptance_raises(b_or_ab):
    with pytest.raises(InternalError, match="EOS sampled in non-accepting state"):
        ConstraintState(b_or_ab).advance(EOS)


def test_token_after_eos_raises(a_plus):
    seq = ConstraintState(a_plus)
    seq.advance(A)
    seq.advance(EOS)
    with pytest.raises(InternalError, match="after EOS"):
        seq.advance(A)


def test_advance_checks_budget_when_given(b_or_ab):
    seq = ConstraintState(b_or_ab)
    with pytest.raises(InternalError, match="needs 1 more tokens, but only 0 are left"):
        seq.advance(A, tokens_left=1)
    ConstraintState(b_or_ab, budget_aware=False).advance(A, tokens_left=1)  # forward-only


def test_must_stop(b_or_ab, a_plus):
    seq = ConstraintState(a_plus)
    assert not seq.must_stop(0)  # not accepting: cannot stop (the mask will raise)
    seq.advance(A)
    assert not seq.must_stop(3)  # accepting, could go on
    assert seq.must_stop(0)  # accepting, budget spent
    done = ConstraintState(b_or_ab)
    done.advance(B)
    assert done.must_stop(5)  # accepting with no outgoing token


def test_check_budget(b_or_ab):
    check_budget(b_or_ab, 1)
    with pytest.raises(BudgetTooSmallError) as err:
        check_budget(b_or_ab, 0, param="max_completion_tokens")
    assert err.value.min_tokens == 1 and err.value.param == "max_completion_tokens"
