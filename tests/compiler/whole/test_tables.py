"""Distances are exact: hand-made vocabularies, and the seed's T x S recurrence as oracle."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.compile import compile_constraint
from gclm.compiler.whole.tables import UNREACHABLE, CompiledTable, build_table, distances

# A three-token vocabulary: a, b, ab; EOS is id 3.
ABC = TokenVocabulary((b"a", b"b", b"ab", None), 3, "plain")


def test_hand_made_distances():
    table = compile_constraint(Constraint.regex("(ab|b)a?"), ABC)
    assert table.min_tokens == 1  # "b" or "ab", one token each
    assert table.shortest_output == "b"
    s_b = table.next_state(table.initial, 1)
    s_ab = table.next_state(table.initial, 2)
    s_a = table.next_state(table.initial, 0)
    assert table.accepting[s_b] and table.accepting[s_ab]
    assert table.dist[s_a] == 1 and not table.accepting[s_a]
    assert table.next_state(s_a, 0) == -1  # "aa" is no prefix
    assert table.next_state(table.initial, 3) == -1  # EOS is not an edge


def test_longer_chain_exact_distance():
    table = compile_constraint(Constraint.regex("(ab){3}"), ABC)
    assert table.min_tokens == 3  # three "ab" tokens; six with "a","b" pairs
    assert table.shortest_output == "ababab"
    after_a = table.next_state(table.initial, 0)
    assert table.dist[after_a] == 3  # "b" then two "ab"


def test_empty_language_for_vocabulary_is_refused():
    import pytest

    from gclm.errors import ConstraintError

    with pytest.raises(ConstraintError):
        compile_constraint(Constraint.regex("c"), ABC)


def test_table_bytes_round_trip():
    table = compile_constraint(Constraint.regex("(ab|b)a?"), ABC)
    again = CompiledTable.from_bytes(table.to_bytes())
    for name in ("accepting", "dist", "group_offsets", "group_next", "group_set"):
        assert np.array_equal(getattr(table, name), getattr(again, name))
    for name, array in table.token_sets.arrays().items():
        assert np.array_equal(array, again.token_sets.arrays()[name])
    assert (again.initial, again.shortest_output) == (table.initial, table.shortest_output)


def test_table_of_another_format_is_refused():
    import io
    import json

    import pytest

    table = compile_constraint(Constraint.regex("(ab|b)a?"), ABC)
    with np.load(io.BytesIO(table.to_bytes())) as z:
        arrays = dict(z.items())
    info = json.loads(arrays["info"].tobytes())
    info["format"] = 1
    arrays["info"] = np.frombuffer(json.dumps(info).encode(), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    with pytest.raises(ValueError, match="another gclm version"):
        CompiledTable.from_bytes(buf.getvalue())


@st.composite
def random_dfa(draw):
    n = draw(st.integers(1, 8))
    v = draw(st.integers(1, 5))
    edges = draw(
        st.lists(
            st.tuples(st.integers(0, n - 1), st.integers(0, v - 1), st.integers(0, n - 1)),
            max_size=25,
            unique_by=lambda e: (e[0], e[1]),  # deterministic
        )
    )
    accepting = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return n, v, edges, np.array(accepting)


def reach_table(n, edges, accepting, t_max):
    """The GCLM seed's recurrence: R[0] = accepting; R[t][s] = R[t-1][s] or any edge
    s -> n with R[t-1][n]."""
    r = np.zeros((t_max + 1, n), dtype=bool)
    r[0] = accepting
    for t in range(1, t_max + 1):
        r[t] = r[t - 1]
        for s, _, d in edges:
            r[t, s] |= r[t - 1, d]
    return r


@given(random_dfa())
@settings(max_examples=200, deadline=None)
def test_dist_agrees_with_the_seed_recurrence(dfa):
    n, _, edges, accepting = dfa
    src = np.array([e[0] for e in edges], dtype=np.int64)
    dst = np.array([e[2] for e in edges], dtype=np.int64)
    dist = distances(n, src, dst, accepting)
    r = reach_table(n, edges, accepting, t_max=n + 1)
    for t in range(n + 2):
        assert np.array_equal(r[t], dist <= t)
    assert np.all((dist == UNREACHABLE) == ~r[n + 1])


@given(random_dfa())
@settings(max_examples=100, deadline=None)
def test_built_table_prunes_and_keeps_shortest(dfa):
    n, v, edges, accepting = dfa
    src = [e[0] for e in edges]
    dist = distances(n, np.array(src, dtype=np.int64), np.array([e[2] for e in edges]), accepting)
    if dist[0] == UNREACHABLE:
        return
    table = build_table(
        vocab_size=v,
        eos_token_id=v,
        initial=0,
        num_states=n,
        accepting=accepting,
        src=src,
        tokens=[e[1] for e in edges],
        dst=[e[2] for e in edges],
    )
    assert table.min_tokens == dist[0]
    assert np.all(table.dist != UNREACHABLE)
    from gclm.compiler.whole.tables import shortest_path

    path = shortest_path(table)
    assert len(path) == table.min_tokens
    state = table.initial
    for token in path:
        state = table.next_state(state, token)
    assert table.accepting[state]
