"""GBNF grammars (llama.cpp's, and the EBNF vLLM's xgrammar backend read) written as Lark, the
grammar syntax gclm compiles: vLLM clients send either in `guided_grammar`.

    lark = to_lark(text)        # the same language, from rule `start`; a Lark text unchanged

A text with a `::=` is GBNF. Each construct has an exact Lark counterpart: `name ::= ...`
rules (generation starts at `root`), string literals with their escapes, character classes
(`[a-z]`, `[^"\\]`), `.` (any character), grouping, alternation, `*`, `+`, `?` and `{m}`,
`{m,}`, `{m,n}`, `{,n}`, and `#` comments. Anything else (xgrammar's lookahead `(= ...)`,
its `TagDispatch`, a class escape such as `\\d`) is a ConstraintError naming the construct
and its line, never an approximation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gclm.errors import ConstraintError, quote

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
    | (?P<comment>\#[^\n]*)
    | (?P<define>::=)
    | (?P<string>"(?:\\.|[^"\\])*")
    | (?P<charclass>\[(?:\\.|[^\]\\])*\])
    | (?P<count>\{\s*\d*\s*(?:,\s*\d*\s*)?\})
    | (?P<name>[A-Za-z0-9_-]+)
    | (?P<op>[|()*+?.=])
    """,
    re.VERBOSE,
)
_ESCAPES = {
    "n": "\n",
    "t": "\t",
    "r": "\r",
    "\\": "\\",
    '"': '"',
    "[": "[",
    "]": "]",
    "-": "-",
    "^": "^",
}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
_ROOT = "root"


def is_gbnf(text: str) -> bool:
    return "::=" in text


def to_lark(text: str) -> str:
    """`text` as a Lark grammar: a GBNF grammar translated, a Lark one as it is.

    Raises ConstraintError naming a GBNF construct without an exact Lark counterpart.
    """
    if not is_gbnf(text):
        return text
    tokens = _tokenize(text)
    rules = _Parser(tokens).rules()
    if _ROOT not in rules:
        raise ConstraintError(
            "The GBNF grammar has no rule named 'root'; generation begins there. Add "
            "`root ::= ...`."
        )
    names = {name: f"r{i}_{_lark_name(name)}" for i, name in enumerate(rules)}
    lines = [f"start: {names[_ROOT]}"]
    for name, body in rules.items():
        lark = body.lark(names)
        if not lark:
            raise ConstraintError(
                f"GBNF grammar: the rule {name!r} matches only the empty string, and a Lark "
                "rule cannot; remove it and make where it is used optional with `?`."
            )
        lines.append(f"{names[name]}: {lark}")
    return "\n".join(lines) + "\n"


def _lark_name(name: str) -> str:
    return re.sub(r"[^a-z0-9_]", "_", name.lower())


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    line: int


def _tokenize(text: str) -> list[_Token]:
    out: list[_Token] = []
    line, pos = 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise _error(line, f"the construct {quote(text[pos : pos + 20])}")
        kind, value = m.lastgroup or "", m.group()
        if kind not in ("space", "comment"):
            out.append(_Token(kind, value, line))
        line += value.count("\n")
        pos = m.end()
    return out


def _error(line: int, what: str) -> ConstraintError:
    return ConstraintError(
        f"GBNF grammar, line {line}: {what} has no exact Lark counterpart. gclm reads rules "
        "(`name ::= ...`), strings, character classes, `.`, groups, `|`, `*`, `+`, `?` and "
        "`{m,n}`; rewrite it with those, or send a Lark grammar."
    )


# ---------------------------------------------------------------------------- the tree


@dataclass(frozen=True)
class _Node:
    """One expression, written as Lark by `lark`."""

    kind: str  # "lit", "class", "any", "ref", "seq", "alt", "repeat"
    text: str = ""
    items: tuple[_Node, ...] = ()
    low: int = 0
    high: int | None = None
    line: int = 0

    def lark(self, names: dict[str, str]) -> str:
        if self.kind == "lit":
            return _lark_string(self.text)
        if self.kind == "class":
            return "/" + self.text + "/"
        if self.kind == "any":
            return r"/[\s\S]/"
        if self.kind == "ref":
            if self.text not in names:
                raise ConstraintError(
                    f"GBNF grammar, line {self.line}: the rule {self.text!r} is used but never "
                    "defined; define it with `name ::= ...`."
                )
            return names[self.text]
        if self.kind == "seq":
            return " ".join(
                f"({i.lark(names)})" if i.kind == "alt" else i.lark(names) for i in self.items
            )
        if self.kind == "alt":
            options = [i for i in self.items if not (i.kind == "seq" and not i.items)]
            body = " | ".join(i.lark(names) for i in options)
            return f"({body})?" if len(options) < len(self.items) else body
        [item] = self.items
        inner = f"({item.lark(names)})"
        if (self.low, self.high) == (0, None):
            return inner + "*"
        if (self.low, self.high) == (1, None):
            return inner + "+"
        if (self.low, self.high) == (0, 1):
            return inner + "?"
        if self.high is None:
            return f"({inner} ~ {self.low} {inner}*)"
        return f"{inner} ~ {self.low}" + ("" if self.high == self.low else f"..{self.high}")


def _lark_string(text: str) -> str:
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _unescape(body: str, line: int) -> list[tuple[str, bool]]:
    """The characters of a literal's or a class's body, each with whether it was escaped."""
    out: list[tuple[str, bool]] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out.append((ch, False))
            i += 1
            continue
        code = body[i + 1 : i + 2]
        if code in _HEX_ESCAPES:
            width = _HEX_ESCAPES[code]
            digits = body[i + 2 : i + 2 + width]
            if len(digits) != width or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise _error(line, f"the escape {quote(body[i : i + 2 + width])}")
            out.append((chr(int(digits, 16)), True))
            i += 2 + width
        elif code in _ESCAPES:
            out.append((_ESCAPES[code], True))
            i += 2
        else:
            raise _error(line, f"the escape {quote(body[i : i + 2])}")
    return out


def _class_regex(text: str, line: int) -> str:
    """A GBNF character class as a Lark regex's class: the characters special in a class (and
    `/`) escaped, control characters as hex escapes, a dash between two characters a range."""
    body = text[1:-1]
    negated = body.startswith("^")
    chars = _unescape(body[1:] if negated else body, line)
    if not chars:
        raise _error(line, "an empty character class")
    parts = []
    for i, (ch, escaped) in enumerate(chars):
        if ch == "-" and not escaped and 0 < i < len(chars) - 1:
            parts.append("-")
        elif ch in "\\]^-[/":  # as Lark reads a /regex/: these stay escaped
            parts.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            parts.append(f"\\x{ord(ch):02x}")
        else:
            parts.append(ch)
    return "[" + ("^" if negated else "") + "".join(parts) + "]"


# ---------------------------------------------------------------------------- the parser


MAX_NESTING = 64  # groups inside groups; deeper is a 400, not a RecursionError


class _Parser:
    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.depth = 0  # open groups

    def peek(self, offset: int = 0) -> _Token | None:
        at = self.pos + offset
        return self.tokens[at] if at < len(self.tokens) else None

    def rules(self) -> dict[str, _Node]:
        rules: dict[str, _Node] = {}
        while self.peek() is not None:
            name, define = self.peek(), self.peek(1)
            assert name is not None
            if name.kind != "name" or define is None or define.kind != "define":
                raise _error(
                    name.line, f"the construct {quote(name.text)} (a rule must start `name ::=`)"
                )
            self.pos += 2
            if name.text in rules:
                raise ConstraintError(
                    f"GBNF grammar, line {name.line}: the rule {name.text!r} is defined twice; "
                    "join its alternatives with `|` in one rule."
                )
            rules[name.text] = self.alternatives(name.line)
        return rules

    def at_rule_start(self) -> bool:
        token, after = self.peek(), self.peek(1)
        return token is None or (
            token.kind == "name" and after is not None and after.kind == "define"
        )

    def alternatives(self, line: int) -> _Node:
        options = [self.sequence(line)]
        while (token := self.peek()) is not None and token.text == "|" and token.kind == "op":
            self.pos += 1
            options.append(self.sequence(token.line))
        return options[0] if len(options) == 1 else _Node("alt", items=tuple(options))

    def sequence(self, line: int) -> _Node:
        items: list[_Node] = []
        while not self.at_rule_start():
            token = self.peek()
            assert token is not None
            if token.kind == "op" and token.text in "|)":
                break
            items.append(self.repeated(self.atom()))
        return items[0] if len(items) == 1 else _Node("seq", items=tuple(items), line=line)

    def atom(self) -> _Node:
        token = self.peek()
        assert token is not None
        self.pos += 1
        if token.kind == "string":
            text = "".join(ch for ch, _ in _unescape(token.text[1:-1], token.line))
            if not text:
                return _Node("seq", line=token.line)
            return _Node("lit", text=text, line=token.line)
        if token.kind == "charclass":
            return _Node("class", text=_class_regex(token.text, token.line), line=token.line)
        if token.kind == "name":
            return _Node("ref", text=token.text, line=token.line)
        if token.text == ".":
            return _Node("any", line=token.line)
        if token.text == "(":
            after = self.peek()
            if after is not None and after.text == "=":
                raise _error(token.line, "a lookahead `(= ...)`")
            self.depth += 1
            if self.depth > MAX_NESTING:
                raise _error(token.line, f"nesting groups over {MAX_NESTING} deep")
            inner = self.alternatives(token.line)
            self.depth -= 1
            close = self.peek()
            if close is None or close.text != ")":
                raise _error(token.line, "a `(` without its `)`")
            self.pos += 1
            return inner
        raise _error(token.line, f"the construct {quote(token.text)}")

    def repeated(self, node: _Node) -> _Node:
        while (token := self.peek()) is not None and (
            token.kind == "count" or (token.kind == "op" and token.text in "*+?")
        ):
            self.pos += 1
            low, high = _bounds(token)
            node = _Node("repeat", items=(node,), low=low, high=high, line=token.line)
        return node


def _bounds(token: _Token) -> tuple[int, int | None]:
    if token.text == "*":
        return 0, None
    if token.text == "+":
        return 1, None
    if token.text == "?":
        return 0, 1
    inside = token.text[1:-1].replace(" ", "")
    low_text, comma, high_text = inside.partition(",")
    low = int(low_text) if low_text else 0
    high = (int(high_text) if high_text else None) if comma else low
    if not low_text and not comma:
        raise _error(token.line, "an empty count `{}`")
    if high is not None and high < low:
        raise _error(token.line, f"the count {token.text} (its maximum is below its minimum)")
    return low, high
