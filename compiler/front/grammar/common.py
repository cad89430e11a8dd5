"""Lark's `common` terminals (lark/grammars/common.lark, MIT), for `%import common.X`.

Written as Lark's own definitions, except where common.lark leans on a lazy match or on
look-behind, which a DFA cannot hold: ESCAPED_STRING is a quoted run of characters and
backslash escapes, and C_COMMENT stops at its first `*/`. Each matches a subset of the
strings Lark's terminal does, and every one of them the way Lark's lexer cuts it.
"""

from __future__ import annotations

COMMON = r"""
DIGIT: "0".."9"
HEXDIGIT: "a".."f"|"A".."F"|DIGIT

INT: DIGIT+
SIGNED_INT: ["+"|"-"] INT
DECIMAL: INT "." INT? | "." INT

_EXP: ("e"|"E") SIGNED_INT
FLOAT: INT _EXP | DECIMAL _EXP?
SIGNED_FLOAT: ["+"|"-"] FLOAT

NUMBER: FLOAT | INT
SIGNED_NUMBER: ["+"|"-"] NUMBER

_STRING_ESC_INNER: /([^"\\\n]|\\[^\n])*/
ESCAPED_STRING: "\"" _STRING_ESC_INNER "\""

LCASE_LETTER: "a".."z"
UCASE_LETTER: "A".."Z"

LETTER: UCASE_LETTER | LCASE_LETTER
WORD: LETTER+

CNAME: ("_"|LETTER) ("_"|LETTER|DIGIT)*

WS_INLINE: (" "|/\t/)+
WS: /[ \t\f\r\n]/+

CR: /\r/
LF: /\n/
NEWLINE: (CR? LF)+

SH_COMMENT: /#[^\n]*/
CPP_COMMENT: /\/\/[^\n]*/
C_COMMENT: /\/\*([^*]|\*+[^*\/])*\*+\//
SQL_COMMENT: /--[^\n]*/
"""
