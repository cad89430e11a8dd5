"""Token sets in three forms (listed, listed complement, packed) answer like packed rows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gclm.compiler.whole.token_sets import TokenSets, unpack_row, words_for

# 100 tokens: 4 words per packed row, so sets of < 4 tokens are listed, sets lacking < 4
# tokens are listed as complements, and the rest are packed.
V = 100


def test_each_set_takes_its_smallest_form():
    sets = [[], [7], [0, 50, 99], list(range(V)), [t for t in range(V) if t != 42], list(range(50))]
    pool = TokenSets.from_token_sets(sets, V)
    assert pool.dense_row.tolist() == [-1, -1, -1, -1, -1, 0]
    assert pool.complement.tolist() == [False, False, False, True, True, False]
    assert [pool.listed(i).tolist() for i in range(5)] == [[], [7], [0, 50, 99], [], [42]]
    assert pool.counts().tolist() == [0, 1, 3, V, V - 1, 50]
    # 5 listed tokens and one packed row, against six packed rows (plus 13 index bytes a set).
    assert pool.tokens.nbytes + pool.dense.nbytes == 5 * 4 + 16
    assert pool.nbytes == 5 * 4 + 16 + 6 * 13 + 8


def test_complement_sets_no_bit_past_the_vocabulary():
    # 70 tokens: the last word has 6 valid bits; a full set must not set the other 26.
    pool = TokenSets.from_token_sets([list(range(70))], 70)
    assert pool.complement[0]
    row = pool.packed([0])[0]
    assert unpack_row(row).tolist() == list(range(70))
    assert not pool.contains(0, 70) and not pool.contains(0, -1)


def test_empty_pool():
    pool = TokenSets.from_token_sets([], V)
    assert len(pool) == 0
    assert pool.packed([]).shape == (0, words_for(V))


token_sets = st.lists(
    st.one_of(
        st.sets(st.integers(0, V - 1), max_size=6),  # small: listed
        st.sets(st.integers(0, V - 1), min_size=V - 6),  # nearly all: complement
        st.sets(st.integers(0, V - 1), min_size=10, max_size=90),  # in between: packed
    ),
    max_size=8,
)


@given(token_sets)
@settings(max_examples=200, deadline=None)
def test_every_form_answers_like_the_packed_row(sets):
    pool = TokenSets.from_token_sets([sorted(s) for s in sets], V)
    packed = pool.packed(np.arange(len(sets)))
    for i, s in enumerate(sets):
        expected = sorted(s)
        assert unpack_row(packed[i]).tolist() == expected
        assert pool.tokens_of(i).tolist() == expected
        assert int(pool.counts()[i]) == len(s)
        assert pool.first_token(i) == (expected[0] if expected else -1)
        assert [t for t in range(V) if pool.contains(i, t)] == expected
        stored = pool.listed(i).size * 4 if not pool.is_packed(i) else words_for(V) * 4
        assert stored <= words_for(V) * 4  # never more than a packed row


@given(token_sets)
@settings(max_examples=50, deadline=None)
def test_packed_round_trip(sets):
    pool = TokenSets.from_token_sets([sorted(s) for s in sets], V)
    again = TokenSets.from_packed(pool.packed(np.arange(len(sets))), V)
    for name, array in pool.arrays().items():
        assert np.array_equal(array, again.arrays()[name])


def test_damaged_arrays_are_refused():
    arrays = TokenSets.from_token_sets([[1], [2, 3]], V).arrays()
    arrays["set_offsets"] = arrays["set_offsets"][:-1]
    with pytest.raises(ValueError, match="damaged"):
        TokenSets.from_arrays(arrays, V)
