"""Lark grammars as regexes: the constraint kind `grammar` (custom tools, and
`structured_outputs.grammar`); frames.py keeps recursive rules as calls for the pushdown
masks (compiler/grown/pushdown.py)."""

from gclm.compiler.front.grammar.lark_regex import (
    GrammarLimits,
    GrammarRegex,
    check_grammar,
    grammar_regex,
)
from gclm.compiler.front.grammar.syntax import grammar_error, parse_grammar

__all__ = [
    "GrammarLimits",
    "GrammarRegex",
    "grammar_error",
    "check_grammar",
    "grammar_regex",
    "parse_grammar",
]
