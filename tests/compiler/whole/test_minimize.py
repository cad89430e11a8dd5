"""Byte DFAs made minimal: the same language, the fewest states, checked before use."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex
from gclm.compiler.whole import minimize
from gclm.compiler.whole.byte_dfa import ByteDfa, byte_dfa
from gclm.compiler.whole.compile import build_dfa
from gclm.compiler.whole.minimize import minimized


def accepts(dfa: ByteDfa, text: bytes) -> bool:
    state = 0
    for b in text:
        state = int(dfa.next[state, dfa.columns[b]])
        if state < 0:
            return False
    return bool(dfa.accepting[state])


def language_classes(dfa: ByteDfa) -> int:
    """How many different languages `dfa`'s states accept, by the table-filling algorithm
    (a reference that shares no code with minimize.py): the state count of a minimal DFA."""
    dfa = dfa.compact()
    n, k = dfa.next.shape
    dead = n  # where -1 leads: it accepts nothing and leads to itself
    trans = np.vstack([np.where(dfa.next < 0, dead, dfa.next), np.full((1, k), dead)])
    accepting = np.append(dfa.accepting, False)
    differ = accepting[:, None] != accepting[None, :]
    changed = True
    while changed:
        changed = False
        for c in range(k):
            col = trans[:, c]
            step = differ[col[:, None], col[None, :]] & ~differ
            if step.any():
                differ |= step
                changed = True
    kept: list[int] = []
    for s in range(n):
        if all(differ[s, t] for t in kept):
            kept.append(s)
    return len(kept)


def test_equal_suffixes_become_one() -> None:
    # Built: one state after "ax" and another after "bx" (the two alternatives' own copies
    # of `y`); minimal: start, after a or b, after x, after y.
    dfa = minimized(byte_dfa("(?:ax|bx)y"))
    assert dfa.next.shape == (4, 256)
    assert [accepts(dfa, t) for t in (b"axy", b"bxy", b"ay", b"axyy", b"")] == [
        True,
        True,
        False,
        False,
        False,
    ]


def test_optional_properties_keep_one_copy_of_each_value() -> None:
    """An object whose properties are all optional, other keys allowed anywhere, writes each
    entry twice (first, or after a comma) and other keys at every place; nested, the DFA
    as built multiplies the copies (MaskBench Github_hard o90821)."""
    inner: dict = {"type": "string"}
    for depth in range(2):  # 10,126 states as built, 2,383 minimal
        inner = {"type": "object", "properties": {f"p{depth}{i}": inner for i in range(3)}}
    constraint = Constraint.json_schema(inner, additional_properties="spec")
    as_built = byte_dfa(to_regex(constraint).regex)
    compiled = minimized(build_dfa(constraint).dfa)
    assert compiled.next.shape[0] < as_built.next.shape[0] / 4
    assert language_classes(compiled) == compiled.next.shape[0]


_ATOMS = st.sampled_from(["a", "b", "c", "ab", "[ab]", "[^a]", "."])


@st.composite
def regexes(draw: st.DrawFn, depth: int = 3) -> str:
    if depth == 0 or draw(st.booleans()):
        return draw(_ATOMS)
    kind = draw(st.sampled_from(["cat", "alt", "star", "opt", "count"]))
    a = draw(regexes(depth - 1))
    if kind == "cat":
        return f"(?:{a})(?:{draw(regexes(depth - 1))})"
    if kind == "alt":
        return f"(?:{a}|{draw(regexes(depth - 1))})"
    if kind == "count":
        lo = draw(st.integers(0, 2))
        return f"(?:{a}){{{lo},{lo + draw(st.integers(0, 2))}}}"
    return f"(?:{a})" + ("*" if kind == "star" else "?")


_TEXTS = [bytes(t) for n in range(6) for t in itertools.product(b"abc\xc3", repeat=n)]


@settings(max_examples=150, deadline=None)
@given(regexes())
def test_same_language_and_minimal(regex: str) -> None:
    built = byte_dfa(regex)
    small = minimized(built)
    for text in _TEXTS:
        assert accepts(small, text) == accepts(built, text), text
    assert small.next.shape[0] == language_classes(small)
    assert small.next.shape[0] <= built.next.shape[0]
    compact = minimized(built.compact())
    assert compact.classes is not None
    assert np.array_equal(compact.next[:, compact.columns], small.next)


def test_a_wrong_partition_is_caught_and_the_next_weights_used(monkeypatch) -> None:
    """A hash collision would merge states that differ: the exact check refuses the
    partition, and the next weights are tried."""
    refine = minimize._refine
    calls = []

    def colliding(table, accepting, weights):
        calls.append(weights)
        if len(calls) == 1:  # every state in one class: what a collision does, at worst
            return np.zeros(table.shape[0], dtype=np.int64), 1
        return refine(table, accepting, weights)

    monkeypatch.setattr(minimize, "_refine", colliding)
    dfa = minimized(byte_dfa("(?:ax|bx)y"))
    assert len(calls) == 2
    assert dfa.next.shape[0] == 4


def test_when_every_partition_is_wrong_the_dfa_is_kept(monkeypatch) -> None:
    monkeypatch.setattr(
        minimize, "_refine", lambda table, acc, w: (np.zeros(table.shape[0], np.int64), 1)
    )
    built = byte_dfa("(?:ax|bx)y")
    assert minimized(built) is built
