"""The bincode readers (compiler/whole/byte_dfa.py, bench/outlines_index.py) against
outlines-core's own get_transitions(), on real indexes."""

from __future__ import annotations

import numpy as np
import outlines_core
import pytest

from bench.outlines_index import parse_index_bytes, read_index, table_from_index
from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex
from gclm.compiler.whole.byte_dfa import (
    BYTE_EOS,
    OUTLINES_CORE_VERSION,
    byte_vocabulary,
    index_extent,
    read_byte_index,
)
from gclm.compiler.whole.tables import CompiledTable, build_table


def test_pinned_outlines_core_version():
    from importlib.metadata import version

    assert version("outlines_core") == OUTLINES_CORE_VERSION


def _reference(index: outlines_core.Index, vocab) -> CompiledTable:
    """The same table through the slow, obvious path: get_transitions() dicts."""
    transitions = index.get_transitions()
    ids: dict[int, int] = {index.get_initial_state(): 0}
    for s in [*transitions, *index.get_final_states()]:
        ids.setdefault(s, len(ids))
    src, tokens, dst = [], [], []
    for s, row in transitions.items():
        for token, n in row.items():
            if token != vocab.eos_token_id:
                src.append(ids[s])
                tokens.append(token)
                dst.append(ids.setdefault(n, len(ids)))
    accepting = np.zeros(len(ids), dtype=bool)
    accepting[[ids[f] for f in index.get_final_states()]] = True
    return build_table(
        vocab_size=vocab.size,
        eos_token_id=vocab.eos_token_id,
        initial=0,
        num_states=len(ids),
        accepting=accepting,
        src=src,
        tokens=tokens,
        dst=dst,
        token_bytes=vocab.token_bytes,
    )


def _canonical(table: CompiledTable) -> list[tuple]:
    """Edges renumbered by a BFS from the initial state in token order: equal for
    isomorphic tables whatever their state numbering."""
    order = {table.initial: 0}
    queue, edges = [table.initial], []
    while queue:
        s = queue.pop(0)
        tokens, nexts = table.transitions(s)
        for t, n in zip(tokens.tolist(), nexts.tolist(), strict=True):
            if n not in order:
                order[n] = len(order)
                queue.append(n)
            edges.append((order[s], t, order[n], int(table.dist[n])))
    finals = sorted(order[s] for s in np.flatnonzero(table.accepting).tolist())
    return [len(order), finals, *edges]


@pytest.mark.parametrize(
    "constraint",
    [
        Constraint.regex(r"(ab|b)a?"),
        Constraint.regex(r"[0-9]{2,4}-(yes|no)"),
        Constraint.choice(["alpha", "beta", "alphabet"]),
        Constraint.json_schema(
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 4},
                    "n": {"type": "integer"},
                },
                "required": ["name"],
            }
        ),
    ],
    ids=["regex", "digits", "choice", "schema"],
)
def test_reader_matches_get_transitions(constraint, embedded_vocab):
    index = outlines_core.Index(to_regex(constraint).regex, embedded_vocab.outlines)
    fast = table_from_index(index, embedded_vocab)
    slow = _reference(index, embedded_vocab)
    assert _canonical(fast) == _canonical(slow)
    assert fast.min_tokens == slow.min_tokens
    assert fast.shortest_output == slow.shortest_output
    # Forward masks are the OR of the groups, and deduplicated.
    for s in range(fast.num_states):
        tokens, _ = fast.transitions(s)
        assert np.array_equal(fast.token_sets.tokens_of(int(fast.state_set[s])), tokens)
    packed = fast.token_sets.packed(np.arange(len(fast.token_sets)))
    assert len({row.tobytes() for row in packed}) == len(fast.token_sets)


def test_reader_refuses_an_unknown_layout(embedded_vocab):
    index = outlines_core.Index("ab", embedded_vocab.outlines)
    _, (blob,) = index.__reduce__()
    with pytest.raises(ValueError, match="outlines-core 0.2.14"):
        parse_index_bytes(blob + b"\x00", embedded_vocab.size, embedded_vocab.eos_token_id)


def test_reader_retries_with_more_room(embedded_vocab):
    """Tiny starting caps force both retry paths; the result must not change."""
    index = outlines_core.Index(r"[a-c]{1,3}(x|yy|zzz)", embedded_vocab.outlines)
    _, (blob,) = index.__reduce__()
    args = (blob, embedded_vocab.size, embedded_vocab.eos_token_id)
    roomy, cramped = parse_index_bytes(*args), parse_index_bytes(*args, id_cap=1, group_cap=1)
    for name in ("accepting", "group_src", "group_next", "group_set", "state_set", "packed_sets"):
        assert np.array_equal(getattr(roomy, name), getattr(cramped, name)), name


@pytest.mark.parametrize(
    "regex",
    [
        r"(ab|b)a?",
        r'"(?:[^"\\\x00-\x1F]|\\["\\/bfnrt]){0,3}"',  # UTF-8 continuation states
        to_regex(Constraint.choice(["alpha", "beta", "alphabet"])).regex,
    ],
    ids=["regex", "string", "choice"],
)
def test_byte_reader_matches_get_transitions(regex):
    """read_byte_index's dense table holds exactly get_transitions()'s byte edges, with
    read_index's state ids (first sight, the initial state 0)."""
    index = outlines_core.Index(regex, byte_vocabulary())
    table, accepting = read_byte_index(index, BYTE_EOS)
    transitions = index.get_transitions()
    ids: dict[int, int] = {index.get_initial_state(): 0}
    for s in index.get_final_states():
        ids.setdefault(s, len(ids))
    expected = {}
    for s, row in transitions.items():
        ids.setdefault(s, len(ids))
        for byte, n in row.items():
            if byte != BYTE_EOS:
                expected[ids[s], byte] = ids.setdefault(n, len(ids))
    assert table.shape == (len(ids), 256)
    assert {
        (int(s), int(b)): int(table[s, b]) for s, b in zip(*np.nonzero(table >= 0), strict=True)
    } == expected
    assert sorted(np.flatnonzero(accepting).tolist()) == sorted(
        ids[f] for f in index.get_final_states()
    )
    grouped = read_index(index, 256, BYTE_EOS)
    assert np.array_equal(grouped.accepting, accepting)


def test_reader_sizes_its_arrays_from_the_blob():
    """The first pass's extent is the blob's largest state id and degree, so the grouping
    pass needs no retry: a state id past the old fixed room (65,536) reads the same as
    with caps that force retries."""
    index = outlines_core.Index(r"(ab|cd){0,3000}", byte_vocabulary())
    transitions = index.get_transitions()
    largest = max(max(transitions), *(n for row in transitions.values() for n in row.values()))
    assert largest > 1 << 16
    _, (blob,) = index.__reduce__()
    max_id, max_degree, end, eos = index_extent(np.frombuffer(blob, dtype=np.uint8))
    assert (max_id, max_degree, end, eos) == (
        largest,
        max(len(row) for row in transitions.values()),
        len(blob),
        BYTE_EOS,
    )
    args = (blob, 256, BYTE_EOS)
    sized, given = parse_index_bytes(*args), parse_index_bytes(*args, id_cap=1, group_cap=1)
    for name in ("accepting", "group_src", "group_next", "group_set", "state_set", "packed_sets"):
        assert np.array_equal(getattr(sized, name), getattr(given, name)), name
