"""compiler/grown/state_walk.py: the walks' per-thread scratch is left zero, whatever happened."""

from __future__ import annotations

import numpy as np
import pytest

from gclm.compiler.grown import state_walk
from gclm.compiler.grown.lazy_dfa import GrowingLazyTable
from gclm.compiler.grown.lazy_table import LazyTable
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.byte_dfa import byte_dfa

REGEX = r'\{"a":"(?:[^"\\\x00-\x1F]|\\["\\/bfnrt])*"\}'


def vocab() -> TokenVocabulary:
    tokens = (*(bytes([b]) for b in range(256)), b'{"a":"', b"ab", b'"}', "é".encode(), None)
    return TokenVocabulary(tokens, eos_token_id=260, scheme="plain")


def test_walks_leave_the_rows_zero():
    table = LazyTable(byte_dfa(REGEX), vocab())
    state = table.next_state(table.initial, 256)  # in the string: a text state
    assert table._text_target(state) == state
    for s in (table.initial, state, table.next_state(state, 258)):
        table.walked(s)
        assert not state_walk._local.rows.any()


def test_a_walk_stopped_midway_leaves_the_rows_zero():
    table = GrowingLazyTable.of_regex(REGEX, vocab())
    build = table._build_row

    def fail_once_rows_are_set(state: int) -> None:
        rows = getattr(state_walk._local, "rows", None)
        if rows is not None and rows.any():  # midway: the walk has set bits
            raise MemoryError("no room")
        build(state)

    table._build_row = fail_once_rows_are_set  # type: ignore[method-assign]
    with pytest.raises(MemoryError):
        state = table.initial
        for token in (256, 257, 258):  # '{"a":"', "ab", '"}': new states, new rows
            state = table.next_state(state, token)
    assert not state_walk._local.rows.any()


def test_split_groups_keeps_few_tokens_as_sorted_ids_and_many_as_rows():
    rows = np.zeros((3, 1), dtype=np.uint32)  # one word: a group of 1+ tokens is dense
    pairs = [(5, 0), (3, 1), (1, 1), (7, 2)]
    for tok, g in pairs:
        rows[g, 0] |= np.uint32(1 << tok)
    tok = np.array([t for t, _ in pairs], dtype=np.int32)
    slot = np.array([g for _, g in pairs], dtype=np.int32)
    counts = np.array([1, 2, 1])
    keep = np.array([True, True, False])
    forward, dense, *_ = state_walk.split_groups(rows, counts, keep, tok, slot, 4)
    assert dense.tolist() == [True, True, False] and int(forward[0]) == (1 << 5) | 0b1010
    wide = np.zeros((3, 4), dtype=np.uint32)  # four words: groups under 4 tokens are ids
    wide[:, 0] = rows[:, 0]
    forward, dense, ids, group, span, by_group = state_walk.split_groups(
        wide, counts, keep, tok, slot, 4
    )
    assert dense.tolist() == [False, False, False]
    assert ids.tolist() == [1, 3, 5] and group.tolist() == [1, 1, 0]
    assert by_group[span[1] : span[2]].tolist() == [1, 3]  # sorted
    assert by_group[span[0] : span[1]].tolist() == [5]
    assert int(forward[0]) == (1 << 5) | 0b1010 and not forward[1:].any()  # 7: not kept
