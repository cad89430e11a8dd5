"""A pushdown table's walks taken over between states of the same shape (compiler/grown/
pushdown.py's PushdownTable._walk): along random deep outputs over the embedded model's
vocabulary, every mask, budget row and successor is the one a table that walks every state
itself gives."""

from __future__ import annotations

import numpy as np
import pytest

from bench.pushdown import GRAMMARS
from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.grammar.frames import grammar_frames
from gclm.compiler.front.json_schema.frames import schema_frames
from gclm.compiler.grown.pushdown import PushdownTable
from gclm.compiler.vocab.vocabulary import TokenVocabulary

# bench/pushdown.py's grammars and schemas that nest deep when pushed.
CASES = ("lists", "calls", "arithmetic", "json", "schema_lists")


def _table(spec: str | dict, vocab: TokenVocabulary) -> PushdownTable:
    if isinstance(spec, dict):
        frames = schema_frames(Constraint.json_schema(spec))
    else:
        frames = grammar_frames(spec)
    assert frames is not None
    return PushdownTable.of_frames(frames, vocab)


@pytest.mark.parametrize("name", CASES)
def test_taken_walks_mask_as_walked_ones(name: str, embedded_vocab: TokenVocabulary) -> None:
    spec, opener = GRAMMARS[name]
    taking, walking = _table(spec, embedded_vocab), _table(spec, embedded_vocab)
    walking.shape_sources = 0
    opening = np.array(
        [bool(b) and set(b) <= set(opener.encode()) for b in embedded_vocab.token_bytes]
    )
    rng = np.random.default_rng(7)
    deepest = 0
    for _ in range(6):
        budget = 72
        a, b = taking.initial, walking.initial
        for step in range(64):
            left = budget - step
            row = taking.row(a, left)
            assert np.array_equal(row, walking.row(b, left)), step
            assert np.array_equal(taking.forward_row(a), walking.forward_row(b)), step
            bits = np.unpackbits(row.view(np.uint8), bitorder="little")[: embedded_vocab.size]
            allowed = np.flatnonzero(bits)
            pushed = allowed[opening[allowed]]
            token = int(rng.choice(pushed if pushed.size and rng.random() < 0.8 else allowed))
            if token == embedded_vocab.eos_token_id:
                break
            a, b = taking.next_state(a, token), walking.next_state(b, token)
            assert a >= 0 and b >= 0
            assert taking.is_accepting(a) == walking.is_accepting(b)
            assert taking.upper[a] == walking.upper[b] and taking.lower[a] == walking.lower[b]
            assert taking.depth(a) == walking.depth(b)
            deepest = max(deepest, taking.depth(a))
    assert deepest >= 8
    assert taking.walks_taken > 0 and walking.walks_taken == 0
