"""Byte DFAs built behind the 0x01 sentinel (compiler/whole/byte_dfa.py): the same language as
outlines-core's token Index of the plain regex, and no exponential DFA build for regexes
whose first characters recur inside them."""

from __future__ import annotations

from collections import deque

import outlines_core
import pytest

from bench.outlines_index import table_from_index
from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.byte_dfa import byte_dfa
from gclm.compiler.whole.compile import compile_constraint
from gclm.compiler.whole.tables import CompiledTable

_WIDE = {"type": "number", "minimum": -1.000017e20, "maximum": 1.100013e20}


def same_language(a: CompiledTable, b: CompiledTable) -> bool:
    """Walk both tables in step from their initial states: every pair of states reached
    allows the same tokens and agrees on acceptance."""
    seen = {(a.initial, b.initial)}
    todo = deque(seen)
    while todo:
        sa, sb = todo.popleft()
        if bool(a.accepting[sa]) != bool(b.accepting[sb]):
            return False
        ta, na = a.transitions(sa)
        tb, nb = b.transitions(sb)
        if ta.tolist() != tb.tolist():
            return False
        for pair in zip(na.tolist(), nb.tolist(), strict=True):
            if pair not in seen:
                seen.add(pair)
                todo.append(pair)
    return True


@pytest.mark.parametrize(
    "constraint",
    [
        Constraint.json_schema(
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 5},
                    "n": {"type": "integer"},
                },
                "required": ["name"],
            }
        ),
        Constraint.json_schema({"type": "integer", "minimum": -120, "maximum": 4100}),
        Constraint.regex(r"[\x00-\x7f]{1,3}!"),  # the sentinel byte is an output byte too
        Constraint.choice(["yes", "no", "maybe"]),
    ],
)
def test_the_sentinel_changes_nothing_of_the_language(
    constraint: Constraint, embedded_vocab: TokenVocabulary
) -> None:
    plain = table_from_index(
        outlines_core.Index(to_regex(constraint).regex, embedded_vocab.outlines), embedded_vocab
    )
    behind = compile_constraint(constraint, embedded_vocab)
    assert behind.min_tokens == plain.min_tokens
    assert behind.shortest_output == plain.shortest_output
    assert same_language(behind, plain)


def test_a_wide_number_range_compiles(embedded_vocab: TokenVocabulary) -> None:
    """Its DFA took over 5 minutes to build without the sentinel (a digit, then up to 19
    more: the unanchored start tracked every place a number could have begun)."""
    constraint = Constraint.json_schema(_WIDE)
    assert byte_dfa(to_regex(constraint).regex).next.shape[0] < 500  # the DFA stays small
    table = compile_constraint(constraint, embedded_vocab)
    assert table.shortest_output == "0"
    state = table.initial
    for ch in "-1000016999999999999.5":
        state = table.next_state(state, _token(embedded_vocab, ch))
        assert state >= 0
    assert table.accepting[state]
    assert table.next_state(table.initial, _token(embedded_vocab, "a")) == -1


def test_a_vocabulary_without_the_sentinel_byte_compiles() -> None:
    vocab = TokenVocabulary((b"a", b"b", None), eos_token_id=2, scheme="byte_level")
    table = compile_constraint(Constraint.regex("ab+"), vocab)
    assert table.shortest_output == "ab"


def _token(vocab: TokenVocabulary, text: str) -> int:
    return vocab.token_bytes.index(text.encode())
