"""compiler/grown/text_slice.py: text tokens set apart, and the states whose walks may skip them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from test_lazy_table import schemas

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex
from gclm.compiler.grown.lazy_dfa import GrowingLazyTable
from gclm.compiler.grown.lazy_table import LazyTable
from gclm.compiler.grown.text_slice import is_text, text_slice, text_target
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.byte_dfa import byte_dfa
from gclm.compiler.whole.token_sets import unpack_row

STRING = r'"(?:[^"\\\x00-\x1F]|\\["\\/bfnrt])*"'


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (b"abc", True),
        (b" \x7f~", True),  # DEL is raw text in JSON
        ("é日😀".encode(), True),
        (b'a"', False),
        (b"a\\", False),
        (b"\n", False),
        (b"\x1f", False),
        ("é".encode()[:1], False),  # part of a character
        ("😀".encode()[1:], False),
        (b"\xed\xa0\x80", False),  # a surrogate is no character
        (b"\xc0\xaf", False),  # an overlong form
    ],
)
def test_text_is_whole_characters_a_string_holds_raw(data, text):
    assert is_text(data) is text


def hand_vocab() -> TokenVocabulary:
    # Every byte, then text tokens and tokens that are not text; EOS last.
    tokens = (
        *(bytes([b]) for b in range(256)),
        b"ab",  # 256
        "é".encode(),  # 257
        b'b"',  # 258
        b"b\\n",  # 259
        "日".encode()[:2],  # 260
        b'"}',  # 261
        None,
    )
    return TokenVocabulary(tokens, eos_token_id=262, scheme="plain")


def test_the_slice_holds_the_text_tokens_and_a_trie_of_the_rest():
    vocab = hand_vocab()
    sliced = text_slice(vocab)
    text = sorted(int(i) for i in unpack_row(sliced.row))
    expected = [i for i in range(262) if is_text(vocab.token_bytes[i])]
    assert text == expected and sliced.count == len(expected)
    assert 256 in text and 257 in text and 0x80 not in text and ord('"') not in text
    assert sorted(sliced.rest.token_ids.tolist()) == [i for i in range(262) if i not in text]
    assert text_slice(vocab) is sliced  # once per vocabulary


def states_after(dfa, data: bytes) -> int:
    state = 0
    for b in data:
        state = int(dfa.next[state, dfa.columns[b]])
    return state


def test_text_target_is_the_loop_of_a_free_string():
    dfa = byte_dfa(r"\{" + STRING + r"\}")
    opened, inside = states_after(dfa, b'{"'), states_after(dfa, b'{"ab')
    built = np.ones(dfa.next.shape[0], dtype=bool)
    assert text_target(dfa.next, dfa.columns, built, inside) == (0, inside)
    assert text_target(dfa.next, dfa.columns, built, opened) == (0, inside)
    assert text_target(dfa.next, dfa.columns, built, 0)[0] == 2  # before the quote
    assert text_target(dfa.next, dfa.columns, built, states_after(dfa, b'{"a\\'))[0] == 2


@pytest.mark.parametrize(
    "regex",
    [
        r'"[a-z]*"',  # a pattern
        r'"(?:[^"\\\x00-\x1F]){0,3}"',  # a length
        r'"([^"\\\x00-\x1F\x7F-\x9F])*"',  # outlines-core's narrower class
        r'"(?:[^"\\\x00-\x1F]x)*"',  # every character, but not back to where it started
    ],
)
def test_strings_that_do_not_loop_on_every_character_are_walked_whole(regex):
    dfa = byte_dfa(regex)
    built = np.ones(dfa.next.shape[0], dtype=bool)
    for state in range(dfa.next.shape[0]):
        assert text_target(dfa.next, dfa.columns, built, state)[0] == 2


def groups(table: LazyTable, state: int) -> dict[int, list[int]]:
    walked = table.walked(state)
    return {
        int(n): sorted(int(t) for t in (g if g.dtype == np.int32 else unpack_row(g)))
        for n, g in zip(walked.nexts, walked.groups, strict=True)
    }


def partition(table: LazyTable, state: int) -> list[list[int]]:
    """`state`'s tokens, grouped by successor (state ids differ between grown tables)."""
    return sorted(groups(table, state).values())


def walk_whole(table: LazyTable) -> LazyTable:
    """`table` with the text slice switched off: every state walked over the whole trie."""
    table._text_target = lambda state: -1  # type: ignore[method-assign]
    return table


@pytest.mark.parametrize("grown", [False, True])
def test_a_text_state_is_walked_to_the_same_groups_as_a_whole_walk(grown):
    vocab = hand_vocab()
    regex = r"\{" + STRING + r"\}"

    def table() -> LazyTable:
        return (
            GrowingLazyTable.of_regex(regex, vocab) if grown else LazyTable(byte_dfa(regex), vocab)
        )

    sliced, whole = table(), walk_whole(table())
    state = sliced.next_state(0, ord("{"))
    opened = sliced.next_state(state, ord('"'))
    assert sliced._text_target(opened) >= 0
    assert partition(sliced, opened) == partition(
        whole, whole.next_state(whole.next_state(0, 123), 34)
    )
    inside = sliced.next_state(opened, 256)  # "ab"
    assert sliced._text_target(inside) == inside
    by_next = groups(sliced, inside)
    assert by_next[inside][:3] == [32, 33, 35]  # text, the quote left out
    assert 256 in by_next[inside] and 257 in by_next[inside]
    assert sliced.next_state(inside, 259) >= 0  # b\n: an escape, back in the text
    assert all(t not in by_next[inside] for t in (34, 92, 258, 260, 261))
    whole_inside = whole.next_state(whole.next_state(whole.next_state(0, 123), 34), 256)
    assert partition(sliced, inside) == partition(whole, whole_inside)
    end = sliced.next_state(inside, 261)  # '"}' closes the object
    assert sliced.is_accepting(end)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(schema=schemas)
def test_random_schemas_walk_to_the_same_groups_sliced_or_whole(schema, embedded_vocab):
    regex = to_regex(Constraint.json_schema(schema)).regex
    sliced = GrowingLazyTable.of_regex(regex, embedded_vocab)
    whole = walk_whole(GrowingLazyTable.of_regex(regex, embedded_vocab))
    # Walk both along every state the sliced table reaches, up to 40 states, side by side.
    todo, seen = [(0, 0)], {(0, 0)}
    while todo and len(seen) < 40:
        a, b = todo.pop()
        assert partition(sliced, a) == partition(whole, b)
        ga = groups(sliced, a)
        for tokens in ga.values():
            pair = (sliced.next_state(a, tokens[0]), whole.next_state(b, tokens[0]))
            if pair not in seen:
                seen.add(pair)
                todo.append(pair)


def test_a_json_string_value_is_walked_sliced(embedded_tokenizer, embedded_vocab):
    schema = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}
    regex = to_regex(Constraint.json_schema(schema)).regex
    table = GrowingLazyTable.of_regex(regex, embedded_vocab)
    state = 0
    text = json.dumps({"s": "hello world"})[:-2]
    for token in embedded_tokenizer.encode(text, add_special_tokens=False):
        state = table.next_state(state, token)
        assert state >= 0
    assert table._text_target(state) == state
