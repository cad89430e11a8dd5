"""ReasoningState: free thinking, the end marker forced at the budget's edge, then the
constraint; exact budget arithmetic on hand-made tables with multi-token markers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from dfa_strategies import bits_of, table_from_edges
from hypothesis import given, settings
from hypothesis import strategies as st

from gclm.errors import BudgetTooSmallError, InternalError
from gclm.masking import allocate_bitmask, apply_bitmask, fill_bitmask
from gclm.masking.drafts import Drafter
from gclm.masking.reasoning import ReasoningState, ThinkingSpec
from gclm.masking.state import check_budget

V, EOS, A, B = 40, 39, 0, 1
# A marker that overlaps itself ("x y x z"): after "x y x", a "y" leaves "x y" matched.
X, Y, Z = 33, 34, 35
MARKER = (X, Y, X, Z)


# Answer language a a b* over 40 tokens (crosses a word boundary): min 2 tokens.
AA_B = table_from_edges(V, EOS, 3, [2], [(0, A, 1), (1, A, 2), (2, B, 2)])


@pytest.fixture
def aa_b():
    return AA_B


def allowed(state: ReasoningState, left: int) -> set[int]:
    return bits_of(state.allowed_row(left))


def run(state: ReasoningState, budget: int, pick) -> tuple[list[int], list[int]]:
    """Sample with `pick(allowed set)` until the state must stop; (thinking, answer)."""
    thinking: list[int] = []
    answer: list[int] = []
    left = budget
    while not state.must_stop(left):
        bitmask = allocate_bitmask(1, V)
        fill_bitmask(bitmask, 0, state, left)
        tok = pick(bits_of(bitmask[0]))
        was_thinking = state.thinking
        state.advance(tok, left)
        if state.finished:
            break
        (thinking if was_thinking else answer).append(tok)
        left -= 1
    return thinking, answer


def test_min_tokens_counts_marker_and_answer(aa_b):
    spec = ThinkingSpec(MARKER)
    assert spec.min_tokens(aa_b) == 4 + 2
    check_budget(aa_b, 6, thinking=spec)
    with pytest.raises(BudgetTooSmallError, match="needs 6 tokens") as e:
        check_budget(aa_b, 5, "max_completion_tokens", thinking=spec)
    assert e.value.param == "max_completion_tokens" and e.value.min_tokens == 6


def test_free_thinking_bans_eos_and_stop_ids(aa_b):
    state = ReasoningState(aa_b, ThinkingSpec(MARKER), banned=[7])
    assert state.thinking and not state.is_accepting and state.dist == 6
    assert allowed(state, 100) == set(range(V)) - {EOS, 7}
    with pytest.raises(InternalError, match="bans it"):
        state.advance(EOS, 100)


def test_edge_forces_the_marker_token_by_token(aa_b):
    state = ReasoningState(aa_b, ThinkingSpec(MARKER))
    # 7 left: a token that does not start the marker leaves 4 + 2 = 6 <= 6: still free.
    assert allowed(state, 7) == set(range(V)) - {EOS}
    state.advance(A, 7)
    # 6 left: only the marker's next token keeps 3 + 2 <= 5.
    assert allowed(state, 6) == {X}
    for left, tok in zip((6, 5, 4, 3), MARKER, strict=True):
        assert allowed(state, left) == {tok}
        state.advance(tok, left)
    assert not state.thinking and state.state == aa_b.initial and state.thinking_tokens == 5
    assert allowed(state, 2) == {A}  # the answer with exactly its minimum left


def test_partial_marker_counts_and_overlaps(aa_b):
    """A thinking that ends with part of the marker needs fewer tokens to close; a token
    breaking the match falls back along the marker's own overlap (KMP)."""
    state = ReasoningState(aa_b, ThinkingSpec(MARKER))
    for tok in (X, Y, X):
        state.advance(tok, 100)
    assert state.matched == 3 and state.dist == 1 + 2
    assert state.after(Y) == 2 and state.after(X) == 1 and state.after(A) == 0
    # 4 left: slack 1. Z closes (0 left to write); Y leaves "x y" (2 > 1): not allowed.
    assert allowed(state, 4) == {Z}
    # 5 left: slack 2: Y (2 left) allowed, X (3 left) and others (4) not.
    assert allowed(state, 5) == {Z, Y}
    with pytest.raises(InternalError, match="outside the mask"):
        state.advance(A, 5)
    state.advance(Y, 5)
    assert state.matched == 2 and state.thinking


def test_marker_written_by_the_model_closes_early(aa_b):
    state = ReasoningState(aa_b, ThinkingSpec(MARKER))
    script = iter([B, *MARKER, A, A, EOS])
    thinking, answer = run(state, 50, lambda ok: next(script))
    assert thinking == [B, *MARKER] and answer == [A, A]
    assert state.is_accepting


def test_cap_closes_thinking_within_it(aa_b):
    state = ReasoningState(aa_b, ThinkingSpec(MARKER, cap=3))
    never_close = lambda ok: min(ok - set(MARKER)) if ok - set(MARKER) else min(ok)  # noqa: E731
    thinking, answer = run(state, 100, never_close)
    assert thinking == [0, 0, 0, *MARKER]
    assert answer[:2] == [A, A] and len(answer) >= 2


def test_cap_zero_writes_only_the_marker(aa_b):
    state = ReasoningState(aa_b, ThinkingSpec(MARKER, cap=0))
    assert allowed(state, 100) == {X}


def test_single_token_marker(aa_b):
    state = ReasoningState(aa_b, ThinkingSpec((X,)))
    assert allowed(state, 4) == set(range(V)) - {EOS}
    state.advance(B, 4)
    assert allowed(state, 3) == {X}
    state.advance(X, 3)
    assert not state.thinking and allowed(state, 2) == {A}


def test_not_budget_aware_thinks_until_its_cap(aa_b):
    state = ReasoningState(aa_b, ThinkingSpec(MARKER), budget_aware=False)
    assert allowed(state, None) == set(range(V)) - {EOS}


def test_marker_must_fit_the_vocabulary(aa_b):
    with pytest.raises(ValueError, match="end-of-sequence"):
        ReasoningState(aa_b, ThinkingSpec((X, EOS)))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        ReasoningState(aa_b, ThinkingSpec((X, V)))
    with pytest.raises(ValueError, match="at least one token"):
        ThinkingSpec(())


def test_no_drafts_while_thinking(aa_b):
    state = ReasoningState(aa_b, ThinkingSpec(MARKER))
    token_bytes = [bytes([97 + i % 26]) for i in range(V)]
    assert Drafter(token_bytes).draft(state, 100, 4) == []


def test_every_budget_from_the_minimum_never_closing(aa_b):
    """A model that never wants to stop thinking: thinking takes exactly what the answer
    does not need, and the answer is complete, at every budget from the minimum."""
    spec = ThinkingSpec(MARKER)
    for budget in range(spec.min_tokens(aa_b), spec.min_tokens(aa_b) + 40):
        state = ReasoningState(aa_b, spec)
        pick = lambda ok: max(ok - set(MARKER) - {A}) if ok - set(MARKER) - {A} else min(ok)  # noqa: E731
        thinking, answer = run(state, budget, pick)
        assert thinking[-4:] == list(MARKER)
        assert len(thinking) == budget - 2 and answer == [A, A]
        assert state.is_accepting


@settings(max_examples=60, deadline=None)
@given(
    extra=st.integers(0, 30),
    seed=st.integers(0, 2**16),
    marker=st.lists(st.sampled_from([X, Y, Z, A]), min_size=1, max_size=5),
    cap=st.none() | st.integers(0, 20),
)
def test_random_decoding_is_valid_and_complete(extra, seed, marker, cap):
    """Random logits at every budget from the minimum up: the marker closes the thinking,
    the answer is complete, and the whole output fits the budget."""
    spec = ThinkingSpec(tuple(marker), cap=cap)
    budget = spec.min_tokens(AA_B) + extra
    state = ReasoningState(AA_B, spec)
    gen = torch.Generator().manual_seed(seed)
    bitmask = allocate_bitmask(1, V)
    left, out = budget, []
    while not state.must_stop(left):
        fill_bitmask(bitmask, 0, state, left)
        logits = torch.randn(1, V, generator=gen) * 3  # [1, V]
        # Bias towards the marker so that models closing early are covered too.
        logits[0, list(marker)] += 2.0
        apply_bitmask(logits, bitmask)
        assert torch.isfinite(logits).any()
        tok = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
        state.advance(tok, left)
        if state.finished:
            break
        out.append(tok)
        left -= 1
    assert state.is_accepting and len(out) <= budget
    ends = state.thinking_tokens
    assert out[ends - len(marker) : ends] == marker
    if cap is not None:
        assert ends <= cap + len(marker)
    assert np.array_equal(out[ends : ends + 2], [A, A])
