"""Each construct of the Lark dialect, compiled to a regex and checked against lark on
hand-picked texts: what lark accepts the regex accepts (where gclm's regex is the whole
language) and what lark refuses the regex refuses."""

from __future__ import annotations

import pytest
from lark.load_grammar import eval_escaping
from lark_oracle import parses, regex_accepts

from gclm.compiler.front.grammar.syntax import unescape

# (grammar, texts in its language, texts outside it)
CASES = {
    "literal": ('start: "ab" "c"', ["abc"], ["ab", "abcc", "ABC"]),
    "literal_i": ('start: "ab"i', ["ab", "AB", "aB"], ["ac", "abab"]),
    "regex": ("start: /a[0-9]+b/", ["a1b", "a123b"], ["ab", "a1"]),
    "regex_i": ("start: /x[a-c]/i", ["xa", "XB", "xC"], ["xd"]),
    "regex_s": ("start: /a.b/s", ["a\nb", "axb"], ["ab"]),
    "regex_no_s": ("start: /a.b/", ["axb"], ["a\nb"]),
    "negated_class": (r"start: /[^\d]x/", ["ax", "-x"], ["1x", "٣x"]),
    "range": ('start: "a".."c"+', ["a", "abc", "cab"], ["d", ""]),
    "alternation": ('start: "a" | "b" "c"', ["a", "bc"], ["ac", "b"]),
    "grouping": ('start: ("a" | "b") "c"', ["ac", "bc"], ["c", "abc"]),
    "optional": ('start: "a" "b"?', ["a", "ab"], ["b", "abb"]),
    "maybe": ('start: "a" ["b" "c"]', ["a", "abc"], ["ab"]),
    "star": ('start: "a" "b"*', ["a", "ab", "abbb"], ["b"]),
    "plus": ('start: "a"+', ["a", "aaa"], ["", "b"]),
    "count": ('start: "a" ~ 3', ["aaa"], ["aa", "aaaa"]),
    "count_range": ('start: "a" ~ 2..3', ["aa", "aaa"], ["a", "aaaa"]),
    "terminal_in_terminal": ("start: AB\nAB: A A\nA: /a/", ["aa"], ["a"]),
    "rule_refs": ('start: x y\nx: "1"\ny: "2" | x', ["12", "11"], ["21"]),
    # One ignored piece per gap: "a  b" is Lark's too, but not generated.
    "ignore": ('start: "a" "b"\n%ignore " "', ["ab", "a b", " ab "], ["a_b"]),
    "import": ("start: INT\n%import common.INT", ["0", "123"], ["-1", "a"]),
    "import_list": (
        'start: WORD "=" SIGNED_NUMBER\n%import common (WORD, SIGNED_NUMBER)',
        ["x=1", "ab=-2.5e3"],
        ["x=", "1=1"],
    ),
    "escaped_string": (
        "start: ESCAPED_STRING\n%import common.ESCAPED_STRING",
        ['""', '"a b"', r'"a\"b"', r'"a\\"'],
        ['"a', 'a"', '"a"b"'],
    ),
    "left_recursion": (
        'start: list\nlist: list "," INT | INT\n%import common.INT',
        ["1", "1,2", "1,2,3,4,5,6,7"],
        ["1,", ",1"],
    ),
    "right_recursion": ('start: "a" start | "b"', ["b", "ab", "aaaaaab"], ["a", "ba"]),
    "comments": ('start: "a" "b" // a comment\n# another\n', ["ab"], ["a"]),
    "continued": ('start: "a"\n     | "b"\n     | "c"', ["a", "b", "c"], ["d"]),
    "modifiers_priority_alias": (
        '?start: x -> y\n!x.2: "a" | "b"\nT.3: "t"',
        ["a", "b"],
        ["t"],
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_regex_agrees_with_lark(name):
    grammar, inside, outside = CASES[name]
    for text in inside:
        assert parses(grammar, text), f"the case is wrong: lark refuses {text!r}"
        assert regex_accepts(grammar, text), text
    for text in outside:
        assert not parses(grammar, text), f"the case is wrong: lark accepts {text!r}"
        assert not regex_accepts(grammar, text), text


def test_nesting_is_cut_and_reported():
    from gclm.compiler.front.constraint import Constraint
    from gclm.compiler.front.regex import to_regex

    grammar = 'start: "(" start ")" | "x"'
    result = to_regex(Constraint.grammar(grammar))
    assert regex_accepts(grammar, "((x))")
    assert parses(grammar, "(((x)))") and not regex_accepts(grammar, "(((x)))")
    assert result.rewrites == (
        "line 1: rule 'start' is recursive; it is nested at most 3 deep, deeper nesting is "
        "not generated",
    )


def test_linear_recursion_is_exact_and_not_reported():
    from gclm.compiler.front.constraint import Constraint
    from gclm.compiler.front.regex import to_regex

    assert to_regex(Constraint.grammar('start: start "a" | "b"')).rewrites == ()


def test_a_long_regex_lowers_the_nesting():
    from gclm.compiler.front.grammar import GrammarLimits, grammar_regex

    grammar = 'start: "(" start start start ")" | "x"'
    deep = grammar_regex(grammar)
    assert deep.depth == 3
    shallow = grammar_regex(grammar, GrammarLimits(regex_budget=len(deep.regex) - 1))
    assert shallow.depth == 2
    assert "nested at most 2 deep" in shallow.notes[0]


@pytest.mark.parametrize(
    "text", ["a", r"\n", r"\t", r"\\", r"\"", r"\d", r"\x41", r"\u00e9", r"a\/b", r"\'"]
)
def test_escapes_are_read_as_lark_reads_them(text):
    assert unescape(text, 1) == eval_escaping(text)


def test_case_variants_come_from_python():
    # K (U+212A KELVIN SIGN) is a variant of k for Python's re; a literal "k"i takes it.
    grammar = 'start: "k"i'
    assert parses(grammar, "\u212a") and regex_accepts(grammar, "\u212a")
