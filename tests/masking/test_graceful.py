"""The graceful-closure policy: exact penalties on a hand-made table, and the guarantee that
it never allows a masked token nor removes an allowed one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from dfa_strategies import table_from_edges

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
    return table_of(edges, 4, [2])


def tokens_of(table, sets, pens) -> dict[int, float]:
    return {
        int(t): float(p)
        for s, p in zip(sets, pens, strict=True)
        for t in table.token_sets.tokens_of(s)
    }


def table_of(edges, num_states, accepting, vocab=40):
    return table_from_edges(vocab, EOS, num_states, list(accepting), edges)


# A JSON-like array of strings: 0 -[-> 1 (or 0 -[]-> 3, an empty literal; a blank loops in
# 0); in 1, ] closes (-> 3), " opens an item (-> 2), "" writes an empty one (-> 4); in 2,
# a and b are content, " ends the item (-> 4), "] ends the array (-> 3); 4 -]-> 3 (accepting).
ARRAY_BYTES = [b"[", b"]", b'"', b"a", b"b", b"[]", b'"]', b" ", b'""']
ARRAY_BYTES += [None] * (40 - len(ARRAY_BYTES))


def array_table():
    edges = [(0, 0, 1), (0, 5, 3), (0, 7, 0), (1, 1, 3), (1, 2, 2), (1, 8, 4)]
    edges += [(2, 3, 2), (2, 4, 2), (2, 2, 4), (2, 6, 3), (4, 1, 3)]
    return table_of(edges, 5, {3})


def array_policy(**settings):
    return GracefulPolicy.for_vocab(ARRAY_BYTES, **settings)


def test_slots_are_free_choices_and_ahead_counts_them():
    table = array_table()
    plan = array_policy()._plan(table)
    # 1 (] or an item) and 2 (content or ") are slots; 0 ([ and a blank) and 4 (] only)
    # are not. The shortest way from 0 is the empty literal [], which skips a slot.
    assert plan.slot == [False, True, True, False, False]
    assert plan.ahead == [1, 0, 0, 0, 0]
    assert plan.slots == 1
    assert array_policy().empty_ids == (5, 8)


def test_closing_a_slot_with_spare_tokens_unspent_is_lowered():
    table = array_table()  # min_tokens 1 ([])
    policy = array_policy(close_penalty=2.0, empty_penalty=1.5, close_cap=3.0)
    # Budget 5 (4 spare), 4 left in 1 (dist 1): writing content leaves 2 spare tokens and
    # no slot lies ahead, so closing (]) leaves 2 unspent: 2 * 2. Opening an item (") is
    # content, never lowered; the empty item ("") is an empty literal: 1.5 * 2.
    sets, pens, blanks, empty = policy.penalties(table, 1, 4, 5)
    assert tokens_of(table, sets, pens) == pytest.approx({1: 4.0})
    assert empty == pytest.approx(3.0) and blanks
    # Inside the item (2) the same holds for "], which closes; " keeps the distance (] is
    # still to come) and is left to the lateral rule, which has no later slot to serve.
    sets, pens, _, _ = policy.penalties(table, 2, 4, 5)
    assert tokens_of(table, sets, pens) == pytest.approx({6: 4.0})
    # With no spare token left, nothing is lowered: closing is all that fits.
    sets, pens, _, empty = policy.penalties(table, 2, 2, 5)
    assert sets == [] and empty == 0.0


def test_a_move_into_a_slot_is_spared_where_the_way_forward_is_an_empty_literal():
    table = array_table()
    policy = array_policy(waste_penalty=3.0)
    # In 0, [ makes no progress (dist 1 -> 1) but leads into the slot; the progress token
    # is the empty literal [] (lowered by the empty penalty instead); the blank loops in
    # 0 and is waste: 3 * 1, besides the blank penalty.
    sets, pens, blanks, empty = policy.penalties(table, 0, 5, 5)
    assert tokens_of(table, sets, pens) == pytest.approx({7: 3.0})
    assert blanks and empty > 0


def key_table():
    """A key then a string slot: 0 -key-> 1 (or -k-> 4 -ey-> 1, two tokens), 1 -:"-> 2; in
    2, c is content and " closes (-> 3, accepting)."""
    edges = [(0, 10, 1), (0, 11, 4), (4, 12, 1), (1, 13, 2), (2, 14, 2), (2, 15, 3)]
    return table_of(edges, 5, {3})


KEY_BYTES = [None] * 10 + [b"key", b"k", b"ey", b':"', b"c", b'"'] + [None] * 24


def test_spelling_a_key_in_more_tokens_than_needed_is_waste():
    table = key_table()  # min_tokens 3 (key :" ")
    policy = GracefulPolicy.for_vocab(KEY_BYTES, waste_penalty=3.0)
    plan = policy._plan(table)
    assert plan.slot == [False, False, True, False, False]
    assert plan.ahead[0] == 1
    # Budget 6, 6 left in 0: k (dist 3 -> 3) costs one token a slot ahead could use.
    sets, pens, _, _ = policy.penalties(table, 0, 6, 6)
    assert tokens_of(table, sets, pens) == pytest.approx({11: 3.0})
    # No slot ahead, no spare token to save: the same budget from a table without the
    # slot's content token lowers nothing.
    bare = table_of([(0, 10, 1), (0, 11, 4), (4, 12, 1), (1, 13, 2), (2, 15, 3)], 5, {3})
    assert policy.penalties(bare, 0, 6, 6).sets == []


def test_content_that_eats_the_later_slots_share_is_lowered():
    """Two string slots in a row: 0 (a, b loop) -"-> 1 (a, b loop) -"-> 2."""
    edges = [(0, 3, 0), (0, 4, 0), (0, 2, 1), (1, 3, 1), (1, 4, 1), (1, 2, 2)]
    table = table_of(edges, 3, {2})
    policy = array_policy(reserve=1.0, lateral_penalty=2.0)
    plan = policy._plan(table)
    assert plan.slot == [True, True, False] and plan.ahead == [1, 0, 0] and plan.slots == 2
    # Budget 6 (4 spare): the second slot may claim 4 * 1/2 = 2. In 0 with 4 left, content
    # leaves 1: 1 short, 2 * 1. Closing (") leaves 0.5 unspent beyond the later slot's
    # share of that 1 (close_penalty 2 * 0.5). With 6 left content leaves 3: not lowered.
    sets, pens, _, _ = policy.penalties(table, 0, 4, 6)
    assert tokens_of(table, sets, pens) == pytest.approx({3: 2.0, 4: 2.0, 2: 1.0})
    lowered = tokens_of(table, *policy.penalties(table, 0, 6, 6)[:2])
    assert 3 not in lowered and 4 not in lowered


def test_silent_where_the_budget_does_not_bite():
    table = chain_table()
    policy = GracefulPolicy(horizon=8, generous=32)
    # Budget 30: every successor leaves 26 or more spare tokens, far beyond the horizon.
    sets, pens, blanks, empty = policy.penalties(table, 0, 28, 30)
    assert sets == [] and not blanks and not empty
    # The last spare tokens of the same request are paced.
    sets, pens, blanks, _ = policy.penalties(table, 1, 6, 30)
    assert sets and blanks
    # A request with 32 spare tokens or more is left to the mask, to its last token.
    assert policy.penalties(table, 1, 6, 33) == ([], [], False, 0.0)
    assert GracefulPolicy(generous=64).penalties(table, 1, 6, 33).sets


def test_past_the_horizon_only_a_slot_left_empty_is_lowered():
    table = array_table()  # min_tokens 1 ([])
    policy = array_policy(horizon=8, empty_penalty=2.0, close_cap=3.0)
    plan = policy._plan(table)
    # 1 is the array just opened (] or an item); 2 (an item's content) and 4 (after an
    # item: ] only) are not. 0 allows [] and 1 allows "": the states with an empty literal.
    assert plan.opened == [False, True, False, False, False]
    assert [plan.has_empty(s) for s in range(5)] == [True, True, False, False, False]
    # Budget 20 (19 spare), 19 left in 1: far past the horizon. Closing the array empty
    # (]) and the empty item ("") leave all 3 unspent tokens (close_cap): 2 * 3 each; a
    # blank, which puts the choice off, is lowered too.
    sets, pens, blanks, empty = policy.penalties(table, 1, 19, 20)
    assert tokens_of(table, sets, pens) == pytest.approx({1: 6.0})
    assert empty == pytest.approx(6.0) and blanks
    # In 0 the empty literal [] skips the one slot ahead: lowered by what is left beyond
    # that slot's share (capped at 3); [ and the blank are left alone this far out.
    sets, pens, blanks, empty = policy.penalties(table, 0, 20, 20)
    assert sets == [] and not blanks and empty == pytest.approx(6.0)
    # Inside an item, and after one, nothing is left empty by what follows: silent.
    assert policy.penalties(table, 2, 19, 20) == ([], [], False, 0.0)
    assert policy.penalties(table, 4, 19, 20) == ([], [], False, 0.0)
    # A request with 32 spare tokens or more is still left to the mask.
    assert policy.penalties(table, 1, 40, 40) == ([], [], False, 0.0)
    # With empty_penalty 0 the rule is off.
    assert array_policy(empty_penalty=0.0).penalties(table, 1, 19, 20) == ([], [], False, 0.0)


def test_blank_tokens_come_from_the_vocabulary():
    token_bytes = [None, b" ", b"\n\n", b" a", b"\t \r", b"", b"x", b'":""', b'\\""', b"[ ]"]
    policy = GracefulPolicy.for_vocab(token_bytes)
    assert policy.blank_ids == (1, 2, 4)
    assert policy.empty_ids == (7, 9)  # an escaped quote then " is not an empty string


def reference(logits, table, state, left, budget, policy):
    """The policy token by token, from the table's transitions."""
    out = logits.clone()
    sets, pens, blanks, empty = policy.penalties(table, state, left, budget)
    for token, pen in tokens_of(table, sets, pens).items():
        out[token] -= pen
    if blanks:
        out[list(policy.blank_ids)] -= policy.blank_penalty
    if empty:
        out[list(policy.empty_ids)] -= empty
    return out


CASES = {
    # (table, policy): bytes unknown (every state with content is a slot), and two
    # byte-aware ones (slots, empty literals, waste).
    **{
        f"chain-reserve-{r}": (
            chain_table,
            lambda r=r: GracefulPolicy(blank_ids=(3, 20), reserve=r),
        )
        for r in (0.0, 0.5, 1.0)
    },
    "array": (array_table, lambda: array_policy(close_penalty=2.0)),
    # A short horizon: the rules past it (a slot left empty) act within these budgets.
    "array-far": (array_table, lambda: array_policy(horizon=2.0)),
    "key": (key_table, lambda: GracefulPolicy.for_vocab(KEY_BYTES)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_adjust_matches_the_reference_and_keeps_the_allowed_set(case):
    make_table, make_policy = CASES[case]
    table, policy = make_table(), make_policy()
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
    assert changed > 5  # the policy did act, in many of these cases


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
    with pytest.raises(ValueError, match="waste_penalty"):
        GracefulPolicy(waste_penalty=-2)
    with pytest.raises(ValueError, match="empty_penalty"):
        GracefulPolicy(empty_penalty=float("nan"))
