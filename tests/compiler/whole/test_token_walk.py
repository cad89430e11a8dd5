"""The token walk against outlines-core's own token Index: the same table, state for state
(over the DFA as built; the compiled table's DFA is minimal, and has the same language)."""

from __future__ import annotations

import time

import numpy as np
import outlines_core
import pytest
from test_index_reader import _canonical
from test_sentinel import same_language

from bench.outlines_index import table_from_index
from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex
from gclm.compiler.vocab.trie import token_trie
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.byte_dfa import byte_dfa
from gclm.compiler.whole.compile import compile_constraint, table_from_grouped
from gclm.compiler.whole.tables import with_shortest_output
from gclm.compiler.whole.token_walk import walk_tokens
from gclm.errors import CompileLimitError, ConstraintError

CONSTRAINTS = {
    "regex": Constraint.regex(r"(ab|b)a?"),
    "digits": Constraint.regex(r"[0-9]{2,4}-(yes|no)"),
    "choice": Constraint.choice(["alpha", "beta", "alphabet"]),
    # Multi-byte characters under a count: tokens that end inside a character.
    "unicode": Constraint.regex(r"[^a]{1,12}(é|日本)"),
    # The shape of JSON Schema's "hostname" (dot-separated labels, counts nested in a count)
    # with labels of 16 characters, not 63: the same walk, a quarter of outlines-core's
    # states (its Index took ~20 s of the suite at 63).
    "hostname": Constraint.regex(
        r'"(?:[0-9A-Za-z](?:[\-0-9A-Za-z]{0,14}[0-9A-Za-z])?\.){0,3}'
        r'[A-Za-z](?:[\-0-9A-Za-z]{0,14}[0-9A-Za-z])?"'
    ),
    "schema": Constraint.json_schema(
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 20},
                "n": {"type": "integer", "minimum": -5},
                "tags": {"type": "array", "items": {"enum": ["a", "b c", "ü"]}},
                "free": {},
            },
            "required": ["name"],
        }
    ),
}


@pytest.mark.parametrize("constraint", CONSTRAINTS.values(), ids=CONSTRAINTS.keys())
def test_walk_matches_outlines_token_index(constraint, embedded_vocab):
    regex = to_regex(constraint).regex
    grouped = walk_tokens(byte_dfa(regex), embedded_vocab)
    assert grouped is not None
    walked = with_shortest_output(
        table_from_grouped(grouped, embedded_vocab), embedded_vocab.token_bytes
    )
    reference = table_from_index(
        outlines_core.Index(regex, embedded_vocab.outlines), embedded_vocab
    )
    assert _canonical(walked) == _canonical(reference)
    assert walked.shortest_output == reference.shortest_output
    for s in range(walked.num_states):  # forward sets are the union of the groups
        tokens, _ = walked.transitions(s)
        assert np.array_equal(walked.token_sets.tokens_of(int(walked.state_set[s])), tokens)
    compiled = compile_constraint(constraint, embedded_vocab)  # over the minimal DFA
    assert same_language(compiled, reference)
    assert compiled.min_tokens == reference.min_tokens
    assert compiled.num_states <= reference.num_states


def test_walk_retries_with_more_room_for_successors(embedded_vocab):
    dfa = byte_dfa(to_regex(CONSTRAINTS["unicode"]).regex)
    roomy, cramped = walk_tokens(dfa, embedded_vocab), walk_tokens(dfa, embedded_vocab, group_cap=1)
    assert roomy is not None and cramped is not None
    for name in ("accepting", "group_src", "group_next", "group_set", "state_set", "packed_sets"):
        assert np.array_equal(getattr(roomy, name), getattr(cramped, name)), name


def test_trie_spells_every_token_once(embedded_vocab):
    trie = token_trie(embedded_vocab)
    spelled: dict[int, bytes] = {}
    path: list[int] = []
    for k in range(trie.byte.size):
        del path[trie.depth[k] - 1 :]
        path.append(int(trie.byte[k]))
        for i in trie.token_ids[trie.token_lo[k] : trie.token_lo[k + 1]].tolist():
            assert i not in spelled
            spelled[i] = bytes(path)
        assert trie.skip[k] > k
    expected = {
        i: b
        for i, b in enumerate(embedded_vocab.token_bytes)
        if b is not None and i != embedded_vocab.eos_token_id
    }
    assert spelled == expected


def test_state_limit_stops_the_walk_early(embedded_vocab):
    """A 20,000-state schema is refused before the walk is done, not after."""
    big = Constraint.json_schema({"type": "string", "minLength": 2000, "maxLength": 2500})
    small_limit = 1000
    started = time.perf_counter()
    with pytest.raises(CompileLimitError, match="more than 1000 DFA states"):
        compile_constraint(big, embedded_vocab, max_states=small_limit)
    refused_s = time.perf_counter() - started
    dfa = byte_dfa(to_regex(big).regex)
    assert walk_tokens(dfa, embedded_vocab, max_states=small_limit) is None
    assert dfa.next.shape[0] > 10 * small_limit  # the full walk would be 10x the work
    assert refused_s < 60  # generous: the point is the None above, on a shared machine


def test_a_character_no_token_spells_is_refused():
    vocab = TokenVocabulary(token_bytes=(b"a", b"b", None), eos_token_id=2, scheme="plain")
    with pytest.raises(ConstraintError, match="no token of this model spells"):
        compile_constraint(Constraint.regex("ac"), vocab)
    assert compile_constraint(Constraint.regex("ab+"), vocab).shortest_output == "ab"
