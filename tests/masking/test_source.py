"""The mask-source protocol (masking/source.py): a whole table's MaskTable and a LazyTable
answer a sequence's questions alike, and `mask_source` / `whole_table` tell them apart in
one place."""

from __future__ import annotations

import numpy as np
import pytest

from gclm.compiler import Constraint, compile_constraint
from gclm.compiler.front.regex import to_regex
from gclm.compiler.grown.lazy_table import LazyTable
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.byte_dfa import byte_dfa
from gclm.errors import BudgetTooSmallError
from gclm.masking import ConstraintState, MaskTable, check_budget, mask_source, whole_table
from gclm.masking.source import MaskSource

BYTES = TokenVocabulary(
    (*(bytes([b]) for b in range(256)), b"ab", b"aba", None), eos_token_id=258, scheme="plain"
)
CONSTRAINT = Constraint.regex("(ab){2,5}c?")


def sources() -> tuple[MaskSource, MaskSource]:
    table = compile_constraint(CONSTRAINT, BYTES)
    lazy = LazyTable(byte_dfa(to_regex(CONSTRAINT).regex), BYTES)
    return mask_source(table), lazy


def test_a_whole_table_gives_its_mask_table_and_a_lazy_one_itself() -> None:
    table = compile_constraint(CONSTRAINT, BYTES)
    lazy = LazyTable(byte_dfa(to_regex(CONSTRAINT).regex), BYTES)
    assert isinstance(mask_source(table), MaskTable) and mask_source(table) is mask_source(table)
    assert mask_source(lazy) is lazy
    assert whole_table(table) is table and whole_table(lazy) is None
    state = ConstraintState(lazy)
    assert state.table is None and state.masks is lazy
    state = ConstraintState(table)
    assert state.table is table and state.masks is mask_source(table)


def test_both_sources_answer_the_same_along_every_output() -> None:
    whole, lazy = sources()
    assert (whole.initial, whole.width, whole.vocab_size) == (lazy.initial, lazy.width, 259)
    assert whole.request_minimum() == lazy.request_minimum() == 2  # "ab" "ab"
    for budget in range(0, 6):
        assert whole.request_fits(budget) == lazy.request_fits(budget) == (budget >= 2)
    # Walk every output of up to 6 tokens through both, comparing at each state.
    frontier = [(whole.initial, lazy.initial)]
    for depth in range(6):
        nxt = []
        for w, z in frontier:
            assert whole.is_accepting(w) == lazy.is_accepting(z)
            assert whole.has_tokens(w) == lazy.has_tokens(z)
            assert whole.dist(w) == lazy.dist(z)
            assert whole.upper_bound(w) == whole.dist(w) <= lazy.upper_bound(z)
            assert np.array_equal(whole.forward_row(w), lazy.forward_row(z))
            for left in range(max(whole.dist(w), 1), 8):
                assert np.array_equal(whole.row(w, left), lazy.row(z, left)), (depth, left)
            for token in (ord("a"), ord("b"), ord("c"), 256, 257, 258):
                a, b = whole.next_state(w, token), lazy.next_state(z, token)
                assert (a < 0) == (b < 0)
                if a >= 0:
                    assert whole.fits(a, 3) == lazy.fits(b, 3)
                    nxt.append((a, b))
        frontier = nxt


@pytest.mark.parametrize("which", ["whole", "lazy"])
def test_the_budget_check_names_the_minimum_of_either(which: str) -> None:
    table = compile_constraint(CONSTRAINT, BYTES)
    source = table if which == "whole" else sources()[1]
    check_budget(source, 2)
    with pytest.raises(BudgetTooSmallError, match="at least 2") as caught:
        check_budget(source, 1, param="max_completion_tokens")
    assert caught.value.param == "max_completion_tokens"
