"""bench/lazy_dfa.py's probe: its UTF-8 ranges and its lazy DFA against outlines-core's."""

from __future__ import annotations

import pytest

from bench.lazy_dfa import LazyDfa, build_nfa, first_tokens, trie_lists, utf8_sequences
from gclm.compiler.vocab.trie import token_trie
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.byte_dfa import byte_dfa


def _matches(seqs: list[list[tuple[int, int]]], data: bytes) -> bool:
    return any(
        len(seq) == len(data) and all(a <= b <= z for (a, z), b in zip(seq, data, strict=True))
        for seq in seqs
    )


@pytest.mark.parametrize("lo, hi", [(0, 0x7F), (0x41, 0x7FF), (0x7F0, 0x10010), (0xD000, 0xE100)])
def test_utf8_sequences_spell_exactly_the_range(lo, hi):
    seqs = utf8_sequences(lo, hi)
    for cp in range(max(lo - 300, 0), hi + 300, 7):
        if 0xD800 <= cp <= 0xDFFF:
            continue  # no UTF-8 encoding
        assert _matches(seqs, chr(cp).encode()) == (lo <= cp <= hi), hex(cp)
    surrogate = "\ud900".encode("utf-8", "surrogatepass")
    assert not _matches(seqs, surrogate)


@pytest.mark.parametrize(
    "regex",
    [
        r'\{"a"[ ]?:[ ]?"(?:[^"\\\x00-\x1F]|\\["\\/bfnrt]){0,3}"\}$',
        r"(?:ab|a[0-9]{2,4})*c?$",
        "[é-ü€]x+$",
    ],
)
def test_lazy_dfa_has_outlines_cores_language(regex):
    _same_language(LazyDfa(*build_nfa(regex)), regex)


@pytest.mark.parametrize(
    "regex",
    [
        r'\{"a"[ ]?:[ ]?"(?:[^"\\\x00-\x1F]|\\["\\/bfnrt]){0,3}"\}$',
        r"(?:ab|a[0-9]{2,4})*?c?$",
        "[é-ü€]x+$",
        r"\U0001f600[\u00e9-\u00fc]{2,}\.[^a-z\]-]$",
        r"(a|b(c|)){1}x{0,}$",
    ],
)
def test_compiled_parser_has_outlines_cores_language(regex):
    from bench.lazy_nfa import as_python_nfa
    from gclm.compiler.grown.regex_parse import ParsedRegex as CompiledProgram

    program = CompiledProgram(regex)
    _same_language(LazyDfa(*as_python_nfa(program, program.root)), regex)


@pytest.mark.parametrize(
    "regex", [r"\d+$", "(?i)a$", "a^b$", "a$b", "(ab$", "ab)$", "a{2,1}$", "[ab$"]
)
def test_compiled_parser_refuses_what_it_does_not_model(regex):
    from gclm.compiler.grown.regex_parse import ParsedRegex as CompiledProgram
    from gclm.compiler.grown.regex_parse import Unsupported

    with pytest.raises(Unsupported):
        CompiledProgram(regex)


def _same_language(ours: LazyDfa, regex: str) -> None:
    """Both DFAs walked side by side from their start states over every byte: the same
    bytes live, the same states accepting."""
    theirs = byte_dfa(regex)
    todo, seen = [(ours.initial, 0)], {(ours.initial, 0)}
    while todo:
        a, b = todo.pop()
        assert ours.accepting(a) == bool(theirs.accepting[b])
        row = ours.row(a)
        for byte in range(256):
            pair = (row[byte], int(theirs.next[b, theirs.columns[byte]]))
            assert (pair[0] < 0) == (pair[1] < 0), (regex, byte)
            if pair[0] >= 0 and pair not in seen:
                seen.add(pair)
                todo.append(pair)
    assert len(seen) > 3


def test_first_tokens_walk_only_the_states_they_need():
    tokens = (*(bytes([b]) for b in range(256)), b'{"a', b"}", None)
    vocab = TokenVocabulary(tokens, eos_token_id=258, scheme="plain")
    nfa, accept = build_nfa(r'\{"a"[ ]?:[0-9]\}$')
    lazy = LazyDfa(nfa, accept)
    assert first_tokens(lazy, trie_lists(token_trie(vocab))) == {ord("{"), 256}
    assert len(lazy.sets) == 4  # the start, '{', '{"', '{"a'
    assert lazy.bytes_to_accept(lazy.initial) == 7  # '{"a":0}'


@pytest.mark.parametrize(
    "regex",
    [r'\{"a"[ ]?:[ ]?"(?:[^"\\\x00-\x1F]|\\["\\/bfnrt]){0,3}"\}$', r"(?:ab|a[0-9]{2,4})*c?$"],
)
def test_compiled_nfa_is_the_python_one_state_for_state(regex):
    import re._parser as sre_parse

    from bench.lazy_dfa import distances
    from bench.lazy_nfa import Program, compiled_nfa

    nfa, accept = build_nfa(regex)
    program = Program()
    states, compiled_accept, dist = compiled_nfa(program, program.seq(sre_parse.parse(regex)))
    assert (states, compiled_accept) == (len(nfa.eps), accept)
    assert dist.tolist() == distances(nfa, accept).tolist()
