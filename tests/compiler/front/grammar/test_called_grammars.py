"""A regex that calls recursive Lark grammars (a tool call's custom tools): its pushdown
masks accept exactly the regex around each grammar's own language (checked by Lark's
Earley parser), at any depth; and `holds_text`, which decides whether a grammar can write
the separator between two calls, against every short text of the grammars."""

from __future__ import annotations

import itertools

import pytest
from lark_oracle import VOCAB, parses

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.grammar.frames import called_frames, grammar_frames
from gclm.compiler.front.grammar.lark_regex import grammar_regex
from gclm.compiler.front.json_schema.calls import call_char
from gclm.compiler.grown.pushdown import PushdownTable
from gclm.compiler.grown.substrings import grammar_holds, holds_text

PARENS = 'start: t\nt: "(" t ")" | "x"'
LISTS = 'start: v\nv: "[" (v ("," v)*)? "]" | "1"'
# The regex around them: "p:" then a PARENS text, or "q:" then a LISTS text, then "!".
PATTERN = f"(?:p:{call_char(1)}|q:{call_char(2)})!"


def called(text: str) -> bool:
    """The oracle: `text` is the pattern around one grammar's text, as Lark parses it."""
    if not text.endswith("!"):
        return False
    head, body = text[:2], text[2:-1]
    grammar = {"p:": PARENS, "q:": LISTS}.get(head)
    return grammar is not None and parses(grammar, body)


def constraint() -> Constraint:
    unrolled = f"(?:p:(?:{grammar_regex(PARENS).regex})|q:(?:{grammar_regex(LISTS).regex}))!"
    return Constraint(
        "regex", unrolled, pushdown=True, calls=(PARENS, LISTS), calls_pattern=PATTERN
    )


def accepts(t: PushdownTable, text: str) -> bool:
    return t.grown.accepts(text.encode())


def test_the_masks_accept_the_pattern_around_each_grammars_language() -> None:
    t = PushdownTable.of_constraint(constraint(), VOCAB)
    assert t is not None
    checked = accepted = 0
    for n in range(6):
        for middle in itertools.product("()x[],1", repeat=n):
            for head in ("p:", "q:"):
                text = head + "".join(middle) + "!"
                assert accepts(t, text) == called(text), text
                checked += 1
                accepted += called(text)
    assert accepted >= 8 and checked > 30_000
    deep = "p:" + "(" * 40 + "x" + ")" * 40 + "!"  # the unrolled regex stops at 3 deep
    assert accepts(t, deep)
    assert not accepts(t, "p:" + "(" * 40 + "x" + ")" * 39 + "!")


def test_what_cannot_be_kept_as_calls_answers_none() -> None:
    assert called_frames(PATTERN, (PARENS, LISTS)) is not None
    # A grammar with no recursion inside a rule keeps its regex: nothing to call.
    assert called_frames(PATTERN, (PARENS, 'start: "a"+')) is None
    # A call character of the pattern's own, or one a grammar could write.
    assert called_frames(PATTERN + call_char(5), (PARENS, LISTS)) is None
    escape = 't: "(" t ")" | "\\U000F0001"\nstart: t'
    assert called_frames(PATTERN, (PARENS, escape)) is None


SEPARATOR = "\n<tool_call>"
# name: (grammar, characters of its short texts, needle)
HOLDS = {
    "parens": (PARENS, "()x", "x)"),
    "parens_never": (PARENS, "()x", "x("),
    "lists": (LISTS, "[],1", "[1,"),
    "lists_never": (LISTS, "[],1", "1["),
    "comparison": ('start: e\ne: "(" e ")" | "a" | e "<" e', "()a<", "a)<("),
}


@pytest.mark.parametrize("name", HOLDS)
def test_holds_text_agrees_with_the_texts_lark_parses(name: str) -> None:
    grammar, alphabet, needle = HOLDS[name]
    frames = grammar_frames(grammar)
    assert frames is not None
    found = any(
        needle in text and parses(grammar, text)
        for n in range(1, 9)
        for text in map("".join, itertools.product(alphabet, repeat=n))
    )
    assert holds_text(frames, needle.encode()) == found
    assert found == (not name.endswith("_never"))


def test_a_grammar_that_can_write_the_separator_is_told_apart() -> None:
    inline = 'start: e\ne: "(" e ")" | /[a-z_<>]+/\n%ignore /\\n/'
    assert grammar_holds(inline, "lark", SEPARATOR)  # "x\n<tool_call>" parses
    assert not grammar_holds(PARENS, "lark", SEPARATOR)
    assert not grammar_holds("[0-9]{5}", "regex", SEPARATOR)
    assert grammar_holds("[a-z<>_\\n]+", "regex", SEPARATOR)
    assert not grammar_holds("[a-z<>_]+(?:\\n[a-z]+)?", "regex", SEPARATOR)
