"""GBNF grammars written as Lark (server/openai/gbnf.py): each construct's exact counterpart,
checked on the strings the compiled regex accepts, and the constructs it refuses."""

from __future__ import annotations

import re

import pytest

from gclm.compiler.front.grammar import grammar_regex
from gclm.errors import ConstraintError
from gclm.server.openai.gbnf import to_lark


def language(gbnf: str) -> re.Pattern[str]:
    return re.compile(grammar_regex(to_lark(gbnf)).regex)


@pytest.mark.parametrize(
    ("gbnf", "accepted", "refused"),
    [
        ('root ::= "yes" | "no"', ["yes", "no"], ["", "yesno", "maybe"]),
        # A rule named before it is defined, a dash in its name, a comment.
        (
            'root ::= answer-word "!"  # shout it\nanswer-word ::= "a" | "b"',
            ["a!", "b!"],
            ["a", "c!"],
        ),
        ("root ::= [a-c]+", ["a", "abcabc"], ["", "d", "a-c"]),
        ('root ::= [^"\\\\]', ["x", "'"], ['"', "\\", "xy"]),
        ("root ::= [-a]", ["-", "a"], ["b"]),
        ("root ::= [a-]", ["-", "a"], ["b"]),
        ("root ::= [\\x41-\\x43\\n]", ["A", "C", "\n"], ["D"]),
        ('root ::= "a" [0-9]{2}', ["a12"], ["a1", "a123"]),
        ('root ::= "a" [0-9]{1,3}', ["a1", "a123"], ["a", "a1234"]),
        ('root ::= "a" [0-9]{2,}', ["a12", "a12345"], ["a1"]),
        ('root ::= "a" [0-9]{,2}', ["a", "a12"], ["a123"]),
        ('root ::= ("ab" | "c")* "."', [".", "abc.", "cab."], ["a.", "abc"]),
        ('root ::= "x" "y"? .', ["xyz", "xz", "x\n"], ["x", "xyzz"]),
        ('root ::= "\\"q\\"\\t\\u00e9"', ['"q"\té'], ["q"]),
        ('root ::= "x" opt\nopt ::= "a"\n  | "b"\n  | ""', ["xa", "xb", "x"], ["xc", "xab"]),
        ("root ::= [/\\]\\^\\-\\[] [ ]", ["/ ", "] ", "^ ", "- ", "[ "], ["a ", "\\ "]),
        # Recursion: written as a repetition where it is one (Lark's rules then apply).
        ('root ::= item ("," item)*\nitem ::= [0-9]', ["1", "1,2,3"], ["1,", ",1"]),
    ],
)
def test_constructs_mean_what_they_mean_in_gbnf(
    gbnf: str, accepted: list[str], refused: list[str]
) -> None:
    regex = language(gbnf)
    for text in accepted:
        assert regex.fullmatch(text), (gbnf, text)
    for text in refused:
        assert not regex.fullmatch(text), (gbnf, text)


def test_a_lark_grammar_is_unchanged() -> None:
    lark = 'start: "a" | b\nb: /[0-9]+/\n'
    assert to_lark(lark) == lark


def test_the_translation() -> None:
    assert to_lark('root ::= "a" x\nx ::= [0-9]+') == (
        'start: r0_root\nr0_root: "a" r1_x\nr1_x: (/[0-9]/)+\n'
    )


@pytest.mark.parametrize(
    ("gbnf", "named"),
    [
        ('root ::= "a" (= "b")', "a lookahead `(= ...)`"),
        ("root ::= [\\d]", "the escape '\\\\d'"),
        ('root ::= "\\q"', "the escape '\\\\q'"),
        ('root ::= "a" ; "b"', "the construct '; "),
        ("root ::= []", "an empty character class"),
        ('root ::= "a"{3,1}', "its maximum is below its minimum"),
        ('start ::= "a"', "no rule named 'root'"),
        ('root ::= other "a"', "'other' is used but never defined"),
        ('root ::= "a"\nroot ::= "b"', "defined twice"),
        ('root ::= ("a"', "a `(` without its `)`"),
        ('root ::= "a" e\ne ::= ""', "the rule 'e' matches only the empty string"),
        ("root ::= " + "(" * 100_000 + '"a"' + ")" * 100_000, "nesting groups over 64 deep"),
    ],
)
def test_what_has_no_exact_counterpart_is_named(gbnf: str, named: str) -> None:
    with pytest.raises(ConstraintError) as caught:
        grammar_regex(to_lark(gbnf))
    assert named in caught.value.message
