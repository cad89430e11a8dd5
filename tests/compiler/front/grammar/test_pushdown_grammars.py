"""Grammars that recurse inside rules, served by the pushdown mask source
(compiler/grown/pushdown.py) with no depth cap: its language is Lark's (checked by Lark's
Earley parser on every short text over the grammar's characters and on random ones), every
output parses and ends within its budget, and nesting goes as deep as the budget allows."""

from __future__ import annotations

import functools
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lark_oracle import VOCAB, parses, sample

from gclm.compiler.front.grammar.frames import grammar_frames, recursive_rules
from gclm.compiler.grown import pushdown
from gclm.compiler.grown.pushdown import PushdownTable
from gclm.errors import BudgetTooSmallError, CompileLimitError, ConstraintError
from gclm.masking import (
    check_budget,
)

# name: (grammar, the characters its short texts are made of, the text that opens a level,
# the bytes the tokens that open one start with)
GRAMMARS = {
    "lists": (
        'start: value\nvalue: "[" (value ("," value)*)? "]" | DIGIT\n%import common.DIGIT',
        "[],1",
        "[",
        b"[",
    ),
    "parens": ('start: t\nt: "(" t ")" | "x"', "()x", "(", b"("),
    "calls": (
        'start: e\ne: "f(" e ("," e)* ")" | NUMBER\n%import common.NUMBER',
        "f(),1.",
        "f(",
        b"f(",
    ),
    "two_rules": (
        """start: a
        a: "<" b ">" | "a"
        b: "{" a a "}" | "b" """,
        "<>{}ab",
        "<",
        b"<{",
    ),
    # Left-recursive and recursing again after it: (a | "(" cond ")") ("&" cond)*.
    "conditions": ('start: cond\ncond: cond "&" cond | "a" | "(" cond ")"', "a()&", "(", b"("),
    "arithmetic": (
        r"""start: sum
        sum: product (("+"|"-") product)*
        product: atom ("*" atom)*
        atom: INT | "(" sum ")" | "-" atom
        %import common.INT
        %import common.WS
        %ignore WS""",
        "()+-*1 ",
        "(",
        b"(",
    ),
    "json": (
        r"""start: value
        value: dict | list | ESCAPED_STRING | INT | "null"
        list: "[" [value ("," value)*] "]"
        dict: "{" [pair ("," pair)*] "}"
        pair: ESCAPED_STRING ":" value
        %import common.ESCAPED_STRING
        %import common.INT
        %import common.WS
        %ignore WS""",
        '[]{}",:1 a',
        "[",
        b"[",
    ),
}


@functools.cache
def table(grammar: str) -> PushdownTable:
    frames = grammar_frames(grammar)
    assert frames is not None
    return PushdownTable.of_frames(frames, VOCAB)


def accepts(t: PushdownTable, text: str) -> bool:
    return t.grown.accepts(text.encode())


@pytest.mark.parametrize("name", GRAMMARS)
def test_every_short_text_is_accepted_exactly_when_lark_parses_it(name):
    grammar, alphabet, _, _ = GRAMMARS[name]
    t = table(grammar)
    longest = 6 if len(alphabet) <= 5 else 5 if len(alphabet) <= 7 else 4
    checked = accepted = 0
    for n in range(1, longest + 1):
        for letters in itertools.product(alphabet, repeat=n):
            text = "".join(letters)
            assert accepts(t, text) == parses(grammar, text), text
            checked += 1
            accepted += parses(grammar, text)
    assert accepted >= 2 and checked > 1000


@pytest.mark.parametrize("name", GRAMMARS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_longer_random_texts_agree_with_lark(name, data):
    grammar, alphabet, opener, _ = GRAMMARS[name]
    t = table(grammar)
    # A text the masks generate, then cut or edited: half of them are in the language.
    text = generate(grammar, data.draw(st.integers(20, 60)), data.draw(st.integers(0, 10**6)))
    if data.draw(st.booleans()):
        at = data.draw(st.integers(0, len(text)))
        edit = data.draw(st.sampled_from(["cut", "insert", "delete"]))
        if edit == "cut":
            text = text[:at]
        elif edit == "insert":
            text = text[:at] + data.draw(st.sampled_from(alphabet + opener)) + text[at:]
        else:
            text = text[:at] + text[at + 1 :]
    assert accepts(t, text) == parses(grammar, text), text


def generate(
    grammar: str, budget: int, seed: int, prefer: bytes = b"", strength: float = 0.0
) -> str:
    """One output through the masks with random logits, at most `budget` tokens; tokens
    made of the bytes `prefer` get `strength` added to their logit (as a client's
    logit_bias)."""
    t = table(grammar)
    bias = torch.zeros(t.vocab_size)
    for i, data in enumerate(VOCAB.token_bytes):
        if data and set(data) <= set(prefer):
            bias[i] = strength
    return sample(t, budget, seed, bias, scale=2.0)


@pytest.mark.parametrize("name", GRAMMARS)
def test_outputs_parse_at_every_budget_from_the_minimum(name):
    grammar, _, _, openers = GRAMMARS[name]
    t = table(grammar)
    low = t.request_minimum()
    with pytest.raises(BudgetTooSmallError) as e:
        check_budget(t, low - 1)
    assert str(low) in str(e.value)
    for budget in range(low, low + 12):
        for seed in range(3):
            text = generate(grammar, budget, seed, openers, 3.0 * seed)
            assert parses(grammar, text), (budget, seed, text)


@pytest.mark.parametrize("name", GRAMMARS)
def test_nesting_pushed_by_a_bias_goes_as_deep_as_the_budget_allows(name):
    """With every opening token pushed hard, 64 tokens nest at least 10 levels deep (the
    unrolled regex stopped at 3), and the output still closes every level in time."""
    grammar, _, opener, openers = GRAMMARS[name]
    text = generate(grammar, 64, 0, openers, 50.0)
    assert parses(grammar, text), text
    assert _nesting(text, opener) >= 10, text


def _nesting(text: str, opener: str) -> int:
    """How deep `text` nests: the most openers not yet closed."""
    closers = {"[": "]", "(": ")", "f(": ")", "<": ">", "{": "}"}
    depth = deepest = 0
    at = 0
    while at < len(text):
        if text.startswith(opener, at):
            depth += 1
            deepest = max(deepest, depth)
            at += len(opener)
            continue
        depth -= text[at] == closers[opener]
        at += 1
    return deepest


def test_a_grammar_without_inner_recursion_keeps_the_regex_path():
    assert grammar_frames('start: item ("," item)*\nitem: "a" | "b"') is None
    # Self-recursion at an alternative's end or start is a repetition already.
    assert grammar_frames('start: list\nlist: list "," "a" | "a"') is None
    assert recursive_rules('start: t\nt: "(" t ")" | "x"') == {"t"}


def test_left_recursion_through_two_rules_is_refused_with_the_rules_named():
    with pytest.raises(ConstraintError, match="'a' -> 'b' -> 'a'|'b' -> 'a' -> 'b'"):
        table('start: a\na: b "x" | "y"\nb: a "z" | "w"')


def test_a_recursion_that_never_ends_is_refused():
    with pytest.raises(ConstraintError, match="generates no string"):
        table('start: t\nt: "(" t ")"')


@pytest.mark.parametrize("name", ["lists", "calls", "two_rules", "json"])
def test_a_row_made_at_one_depth_serves_every_depth(name):
    """Going deeper makes new states (their stacks differ) but no new closures: each byte's
    configurations, seen from the state's base, were closed at a shallower depth."""
    grammar, _, _, opener = GRAMMARS[name]
    frames = grammar_frames(grammar)
    assert frames is not None
    t = PushdownTable.of_frames(frames, VOCAB)
    state = t.initial
    counts = []
    for level in range(1, 31):
        for byte in opener:
            state = t.next_state(state, byte)
            assert state >= 0
        t.forward_row(state)  # the walk over the whole vocabulary from there
        assert t.depth(state) >= level
        if level in (6, 30):
            counts.append((t.grown.states, t.grown.closures))
    (states_6, closures_6), (states_30, closures_30) = counts
    assert states_30 > states_6
    assert closures_30 == closures_6


def test_the_tables_states_are_a_wall(monkeypatch):
    monkeypatch.setattr(pushdown, "MAX_PUSHDOWN_STATES", 40)
    grammar = 'start: t\nt: "(" t ")" | "x"'
    frames = grammar_frames(grammar)
    assert frames is not None
    t = PushdownTable.of_frames(frames, VOCAB)
    state = t.initial
    with pytest.raises(CompileLimitError, match="40 automaton states"):
        for _ in range(100):
            state = t.next_state(state, ord("("))


def test_an_ambiguous_grammars_readings_are_a_wall(monkeypatch):
    monkeypatch.setattr(pushdown, "MAX_CONFIGURATIONS", 30)
    grammar = 'start: e\ne: "(" e ")" | e2\ne2: "(" e2 ")" | "(" e ")" | "x"'
    frames = grammar_frames(grammar)
    assert frames is not None
    t = PushdownTable.of_frames(frames, VOCAB)
    state = t.initial
    with pytest.raises(CompileLimitError, match="ambiguous"):
        for _ in range(60):
            state = t.next_state(state, ord("("))


@pytest.mark.parametrize("name", GRAMMARS)
def test_the_minimum_is_the_exact_one(name):
    """The 400's minimum is the whole table's exact one (the unrolled regex holds every
    shortest output, none of which nests)."""
    from gclm.compiler.front.constraint import Constraint
    from gclm.compiler.whole.compile import compile_constraint

    grammar = GRAMMARS[name][0]
    whole = compile_constraint(Constraint.grammar(grammar), VOCAB)
    assert table(grammar).request_minimum() == whole.min_tokens
