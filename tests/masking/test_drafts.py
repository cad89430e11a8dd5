"""Drafter: drafts follow forced text only, within the budget, and stop where text branches."""

from __future__ import annotations

from dfa_strategies import table_from_edges

from gclm.masking import ConstraintState
from gclm.masking.drafts import Drafter

EOS = 9
# Token spellings: "k", "ke", "key", "y", ":", "a", "b", "x", unused, EOS.
BYTES = [b"k", b"ke", b"key", b"y", b":", b"a", b"b", b"x", b"?", None]


def key_table():
    """The text `key:` then `a` or `b` (accepting, 5), or `x` looping before them (4).

    From 0 the tokens "k" (to 1), "ke" (to 2) and "key" (to 3) all spell prefixes of "key";
    2 continues with "y"; 3 forces ":"; 4 branches on a / b / x. State 1 goes on only with
    "y" (to 6), from where "a" and "x" branch.
    """
    k, ke, key, y, colon, a, b, x = range(8)
    edges = [(0, k, 1), (0, ke, 2), (0, key, 3), (2, y, 3), (3, colon, 4)]
    edges += [(4, a, 5), (4, b, 5), (4, x, 4)]
    edges += [(1, y, 6), (6, a, 5), (6, x, 4)]
    return table_from_edges(10, EOS, 7, [5], edges)


def test_drafts_follow_forced_text_and_stop_where_it_branches():
    state = ConstraintState(key_table())
    drafter = Drafter(BYTES)
    # From 0 every allowed token spells a prefix of "key": the longest, then ":" (forced).
    assert drafter.draft(state, tokens_left=10, limit=8) == [2, 4]
    assert drafter.draft(state, tokens_left=10, limit=1) == [2]
    state.advance(2, 10)
    assert drafter.draft(state, tokens_left=9, limit=8) == [4]
    state.advance(4, 9)
    assert drafter.draft(state, tokens_left=8, limit=8) == []  # a, b or x: not forced
    state.advance(5, 8)
    assert state.is_accepting
    assert drafter.draft(state, tokens_left=7, limit=8) == []  # EOS competes


def test_drafts_leave_the_budget_to_finish():
    state = ConstraintState(key_table())
    drafter = Drafter(BYTES)
    # "key" ":" then one of a/b: 3 tokens. With 3 left both drafts fit; with fewer the
    # request would have been refused, and the drafts never spend what finishing needs.
    assert drafter.draft(state, tokens_left=3, limit=8) == [2, 4]
    state.advance(2, 3)
    assert drafter.draft(state, tokens_left=2, limit=8) == [4]


def test_a_state_whose_tokens_disagree_gets_no_draft():
    state = ConstraintState(key_table())
    state.advance(0, 10)  # "k": then only "y" to the dead branch, which is forced
    drafter = Drafter(BYTES)
    assert drafter.draft(state, tokens_left=10, limit=8) == [3]
    state.advance(3, 10)  # state 6: "a" or "x", different texts
    assert drafter.draft(state, tokens_left=9, limit=8) == []
