"""Grammars gclm cannot compile: a ConstraintError that names the line, the construct and
the fix."""

from __future__ import annotations

import pytest

from gclm.compiler.front.constraint import Constraint, parse_constraint
from gclm.compiler.front.regex import to_regex
from gclm.errors import CompileLimitError, ConstraintError

ERRORS = [
    ('start: "a"\nstart: "b"', r"line 2: 'start' is defined twice \(first on line 1\)"),
    ("start: x", r"line 1: the rule 'x' is not defined"),
    ("start: X", r"line 1: the terminal 'X' is not defined.*%import common.X"),
    ('start: "a"\nX: y\ny: "b"', r"line 2: the terminal 'X' uses the rule 'y'"),
    ('start: X\nX: "a" X', r"line 2: the terminal 'X' is recursive"),
    ("start: /a(?=b)/", r"line 1: the regex /a\(\?=b\)/ cannot be compiled: it uses look-around"),
    ("start: /^a/", r"line 1: .* anchor"),
    (r"start: /(a)\1/", r"line 1: .*backreference"),
    ("start: /a[/", r"line 1: .*does not parse"),
    ("start: /a*/", r"line 1: a token can match the empty string"),
    ('start: "a" ""', r'line 1: an empty string ""'),
    ('start: "a" ~ 3..2', r"line 1: the repetition `~ 3..2` has its bounds reversed"),
    ("start: x{a}", r"line 1: 'x'\{...\} uses a template"),
    ('start: "a"\n%declare X', r"line 2: %declare is not supported"),
    ('start: "a"\n%import .other.X', r"line 2: .*expected a module name"),
    ('start: "a"\n%import python.NAME', r"line 2: %import of 'python.NAME'"),
    ('start: "a"\n%import common.NOPE', r"line 2: common has no terminal 'NOPE'"),
    ('start: "a"\n%ignore x\nx: "b"', r"line 2: %ignore names the rule 'x'"),
    ('start: "a" )', r"line 1: expected the end of the definition"),
    ('start: ("a"', r"line 1: expected '\)'"),
    ("start: fooBar", r"line 1: the name 'fooBar' mixes cases"),
    ('start "a"', r"line 1: expected ':' after 'start'"),
    ('start: "a" @', r"line 1: unexpected character '@'"),
    ('item: "a"', r"no rule named 'start'"),
    ('start: "a"*', r"matches the empty string"),
    ('start: "(" start ")"', r"generates no string"),
    ("start: /a/l", r"line 1: .*flag"),
]


@pytest.mark.parametrize(("grammar", "message"), ERRORS)
def test_refusal_names_the_line_and_the_fix(grammar, message):
    with pytest.raises(ConstraintError, match=message) as e:
        to_regex(Constraint.grammar(grammar))
    assert e.value.message.endswith(".")


def test_a_huge_count_is_a_compile_limit():
    with pytest.raises(CompileLimitError, match="line 1: `~ 20000`"):
        to_regex(Constraint.grammar('start: "a" ~ 20000'))


def test_a_grammar_over_the_regex_budget_is_a_compile_limit():
    from gclm.compiler.front.grammar import GrammarLimits, grammar_regex

    with pytest.raises(CompileLimitError, match="over gclm's limit of 10 characters"):
        grammar_regex('start: "abcdefgh" "ijklmnop"', GrammarLimits(regex_budget=10))


def test_structured_outputs_grammar_and_the_regex_syntax():
    assert parse_constraint({"grammar": 'start: "a"'}) == Constraint("grammar", 'start: "a"')
    # A regex grammar is the regex constraint: one cache entry whichever field sent it.
    assert Constraint.grammar("a+", syntax="regex") == Constraint.regex("a+")
    with pytest.raises(ConstraintError, match="Unknown grammar syntax 'ebnf'"):
        Constraint.grammar("x", syntax="ebnf")
    with pytest.raises(ConstraintError, match="non-empty string"):
        parse_constraint({"grammar": "  "})


def test_grammars_key_the_cache_apart():
    a, b = Constraint.grammar('start: "a"'), Constraint.grammar('start: "b"')
    assert a.key_material() != b.key_material()
    assert a.key_material() != Constraint.regex('start: "a"').key_material()
