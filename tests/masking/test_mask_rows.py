"""Packed rows of MaskTable: exact bits on hand-made tables, and the reference semantics."""

from __future__ import annotations

import numpy as np
import pytest
from dfa_strategies import bits_of, random_tables, reference_allowed, table_from_edges
from hypothesis import given, settings

from gclm.errors import InternalError
from gclm.masking import MaskTable, mask_table, num_words

A, B, EOS = 0, 1, 2


@pytest.fixture
def b_or_ab():
    """Language {"b", "ab"} over tokens a=0, b=1, EOS=2."""
    return table_from_edges(3, EOS, 3, [2], [(0, A, 1), (0, B, 2), (1, B, 2)])


def test_forward_rows_exact(b_or_ab):
    masks = mask_table(b_or_ab)
    assert masks.width == 1
    assert int(masks.forward_row(0)[0]) == 0b011  # a, b
    assert int(masks.forward_row(1)[0]) == 0b010  # b
    assert int(masks.forward_row(2)[0]) == 0b100  # EOS only
    assert masks.maxsucc.tolist() == [1, 0, -1]


def test_tight_rows_exact(b_or_ab):
    masks = mask_table(b_or_ab)
    assert int(masks.row(0, 2)[0]) == 0b011  # budget does not bite: the forward row
    assert masks.row(0, 2) is masks.forward_row(0)
    assert int(masks.row(0, 1)[0]) == 0b010  # one token left: only b reaches acceptance
    assert int(masks.row(1, 1)[0]) == 0b010
    assert int(masks.row(2, 0)[0]) == 0b100  # no budget left: EOS is free


def test_budget_below_distance_is_internal_error(b_or_ab):
    with pytest.raises(InternalError, match="needs 1 more tokens but only 0 are left"):
        mask_table(b_or_ab).row(0, 0)


def test_identical_states_share_one_row():
    # a a a* : states 0 and 1 allow exactly {a}; state 2 allows {a, EOS}.
    table = table_from_edges(3, EOS, 3, [2], [(0, A, 1), (1, A, 2), (2, A, 2)])
    masks = mask_table(table)
    assert masks.num_rows == 2
    assert masks.row_of_state[0] == masks.row_of_state[1] != masks.row_of_state[2]
    assert int(masks.forward_row(2)[0]) == 0b101


def test_bits_across_word_boundary():
    # Tokens 0, 31 and 32 from state 0; EOS is 39 (second word).
    table = table_from_edges(40, 39, 2, [1], [(0, 0, 1), (0, 31, 1), (0, 32, 1)])
    masks = mask_table(table)
    assert masks.width == num_words(40) == 2
    row = masks.forward_row(0)
    assert row.dtype == np.int32
    assert row.view(np.uint32).tolist() == [(1 << 31) | 1, 1]
    assert masks.forward_row(1).view(np.uint32).tolist() == [0, 1 << 7]


def test_tight_rows_are_shared_between_equivalent_budgets():
    # From 0: token 0 accepts at once (dist 0), token 1 enters a 4-token chain (dist 4).
    edges = [(0, 0, 5), (0, 1, 1), (1, 3, 2), (2, 3, 3), (3, 3, 4), (4, 3, 5)]
    table = table_from_edges(4, 2, 6, [5], edges)
    masks = MaskTable(table)
    assert masks.maxsucc[0] == 4
    tight = [masks.row(0, r) for r in range(1, 5)]
    assert all(row is tight[0] for row in tight)  # r - 1 in 0..3: only token 0
    assert bits_of(tight[0]) == {0}
    assert bits_of(masks.row(0, 5)) == {0, 1}


def test_rows_are_read_only(b_or_ab):
    masks = mask_table(b_or_ab)
    with pytest.raises(ValueError):
        masks.forward_row(0)[0] = 0
    with pytest.raises(ValueError):
        masks.row(0, 1)[0] = 0


def test_mask_table_is_cached_per_table(b_or_ab):
    assert mask_table(b_or_ab) is mask_table(b_or_ab)


def test_tight_cache_is_bounded():
    edges = [(0, 0, 5), (0, 1, 1), (1, 3, 2), (2, 3, 3), (3, 3, 4), (4, 3, 5), (1, 0, 5)]
    table = table_from_edges(4, 2, 6, [5], edges)
    masks = MaskTable(table, tight_cache_bytes=4)  # room for one row
    first = masks.row(0, 1)
    masks.row(1, 1)
    assert bits_of(masks.row(0, 1)) == {0}
    assert masks.row(0, 1) is not first  # evicted and rebuilt


@settings(max_examples=150, deadline=None)
@given(random_tables())
def test_every_row_matches_the_reference_semantics(table):
    masks = MaskTable(table)
    top = int(table.dist.max()) + 2
    for s in range(table.num_states):
        assert bits_of(masks.forward_row(s)) == reference_allowed(table, s, None)
        for left in range(0, top + 1):
            if left < table.dist[s]:
                with pytest.raises(InternalError):
                    masks.row(s, left)
            else:
                assert bits_of(masks.row(s, left)) == reference_allowed(table, s, left)


@settings(max_examples=100, deadline=None)
@given(random_tables())
def test_next_state_matches_the_table(table):
    masks = MaskTable(table)
    for s in range(table.num_states):
        for t in range(-1, table.vocab_size + 1):
            assert masks.next_state(s, t) == table.next_state(s, t)


def test_next_state_in_every_set_form():
    """4096 tokens (128 words): sets of under 128 tokens are listed (frozensets up to 64,
    packed rows past that), sets lacking under 128 tokens are listed complements, the rest
    packed. Every form must give the successor of the edge list."""
    vocab, eos = 4096, 4095
    edges = {(0, 5): 1}
    edges |= {(0, t): 2 for t in range(100, 200)}  # 100 listed tokens
    edges |= {(0, t): 3 for t in range(1000, 3000)}  # packed, the largest group
    edges |= {(1, t): 3 for t in range(vocab - 1) if t not in (5, 7)}  # a complement
    edges |= {(1, 5): 2, (2, 10): 3, (2, 11): 3, (3, 7): 3, (3, 8): 0}
    table = table_from_edges(vocab, eos, 4, [3], [(s, t, n) for (s, t), n in edges.items()])
    pool = table.token_sets
    assert pool.complement.any() and pool.is_packed(int(table.state_set[0]))
    assert max(pool.listed(i).size for i in range(len(pool))) == 100
    masks = MaskTable(table)
    for s in range(4):
        got = [masks.next_state(s, t) for t in range(-1, vocab + 1)]
        assert got == [edges.get((s, t), -1) for t in range(-1, vocab + 1)]


def test_a_bounded_table_cache_bounds_the_mask_rows(embedded_vocab):
    # The probe: the LRU counted table.nbytes only, while each table's mask rows (1.7-2.7 MB
    # at this vocabulary) stayed alive beside it; memory grew ~2 MB per distinct schema.
    import gc
    import weakref

    from gclm.compiler.front.constraint import Constraint
    from gclm.compiler.service.cache import TableCache
    from gclm.compiler.whole.compile import compile_constraint
    from gclm.masking.masks import table_memory

    compiled = []

    def compile_fn(constraint):
        table = compile_constraint(constraint, embedded_vocab)
        compiled.append(weakref.ref(table))
        return table

    schemas = [
        {"type": "object", "properties": {f"k{i}": {"type": "string", "maxLength": 5}}}
        for i in range(6)
    ]
    probe = compile_constraint(Constraint.json_schema(schemas[0]), embedded_vocab)
    one = table_memory(probe)
    assert one > 2 * probe.nbytes  # the mask rows are most of what a table holds
    del probe
    cache = TableCache(
        compile_fn, embedded_vocab.fingerprint, max_bytes=int(2.5 * one), measure=table_memory
    )
    for schema in schemas:
        cache.get(Constraint.json_schema(schema))
        assert cache.nbytes <= cache.max_bytes
    gc.collect()
    alive = [table for table in (ref() for ref in compiled) if table is not None]
    assert len(alive) == 2  # the evicted tables took their mask rows with them
    assert sum(table_memory(t) for t in alive) == cache.nbytes
