"""The guarantee on grammars: every output generated through the masks, at every budget
from the minimum up, parses with the `lark` package (the independent checker)."""

from __future__ import annotations

import pytest
from lark_oracle import outputs_parse, parses, table

from gclm.errors import BudgetTooSmallError
from gclm.masking import check_budget

GRAMMARS = {
    "arithmetic": r"""
        start: expr
        ?expr: term (("+"|"-") term)*
        ?term: factor (("*"|"/") factor)*
        ?factor: NUMBER | "(" expr ")" | "-" factor
        %import common.NUMBER
        %import common.WS
        %ignore WS
    """,
    "case_insensitive_sql": r"""
        start: "select"i _WS cols _WS "from"i _WS NAME
        cols: NAME ("," _WS? NAME)*
        NAME: /[a-z_][a-z0-9_]*/i
        _WS: /[ \t]+/
    """,
    "regex_flags": r"""
        start: A B C
        A: /a.b/s
        B: /[^\d\s]x/
        C: /(?i:q)[\w]{2}/
    """,
    "counts_and_ranges": r"""
        start: DIGITS "-" pair ~ 2..3 "!"?
        DIGITS: "0".."9" ~ 3
        pair: "x" | "y" "z"
    """,
    "left_recursive_list": r"""
        start: "[" list "]"
        list: list "," item | item
        item: INT | CNAME
        %import common (INT, CNAME)
        %ignore " "
    """,
    "json": r"""
        ?start: value
        ?value: object | array | ESCAPED_STRING | SIGNED_NUMBER -> number
              | "true" | "false" | "null"
        array: "[" [value ("," value)*] "]"
        object: "{" [pair ("," pair)*] "}"
        pair: ESCAPED_STRING ":" value
        %import common.ESCAPED_STRING
        %import common.SIGNED_NUMBER
        %import common.WS
        %ignore WS
    """,
    "comments_ignored": r"""
        start: stmt+
        stmt: WORD ";"
        %import common.WORD
        %import common.C_COMMENT
        %import common.CPP_COMMENT
        %import common.WS
        %ignore WS
        %ignore C_COMMENT
        %ignore CPP_COMMENT
    """,
    "import_alias": r"""
        start: N ("+" N)*
        %import common.SIGNED_INT -> N
    """,
    "nested_parens": r"""
        start: item
        item: "a" item | "b" | "(" start ")"
    """,
    "optional_and_maybe": r"""
        start: "<" NAME [":" NAME] ("=" VALUE)? ">" "x"*
        NAME: LETTER+
        VALUE: DIGIT+ | ESCAPED_STRING
        %import common (LETTER, DIGIT, ESCAPED_STRING)
    """,
}


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_every_output_parses_at_every_budget_from_the_minimum(name):
    texts = outputs_parse(GRAMMARS[name])
    assert len(set(texts)) > 3  # the sampler explores, it does not repeat one string


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_a_budget_below_the_minimum_is_refused(name):
    t = table(GRAMMARS[name])
    with pytest.raises(BudgetTooSmallError) as e:
        check_budget(t, t.min_tokens - 1)
    assert e.value.min_tokens == t.min_tokens


def test_the_shortest_output_parses_and_is_the_minimum():
    grammar = GRAMMARS["counts_and_ranges"]
    t = table(grammar)
    assert parses(grammar, t.shortest_output)
    # DIGITS (3 digits: "12" is one token), "-", two pairs, no "!".
    assert t.min_tokens == 5


def test_the_checker_rejects_what_the_grammar_does_not_allow():
    # The oracle is not vacuous: it refuses near misses of what the tests generate.
    grammar = GRAMMARS["arithmetic"]
    assert parses(grammar, "1 + (2*3)")
    assert not parses(grammar, "1 + (2*3")
    assert not parses(grammar, "1 ++ 2 x")
