"""Read the Lark grammar text users write into definitions (rules and terminals).

The dialect is Lark's own (https://lark-parser.readthedocs.io/en/latest/grammar.html):
`name: expansions` rules (lowercase names, `?`/`!` modifiers and `.n` priorities read and
ignored: they shape trees, not the language), `NAME: expansions` terminals, string literals
(`"..."`, with the `i` flag), regex terminals (`/.../flags`, Python `re` syntax), ranges
(`"a".."z"`), alternation, grouping, `[...]`, `?`, `*`, `+`, `~ n`, `~ n..m`, aliases
(`-> name`, ignored), `%ignore` and `%import common.X`. Comments start with `//` or `#`;
a line that starts with `|` continues the definition above it. Templates, `%declare`,
`%override`, `%extend` and imports of anything but `common` are refused, each with the line
it is on.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from gclm.compiler.front.rust_regex import MAX_COUNT
from gclm.errors import CompileLimitError, ConstraintError, quote

# What a grammar may hold, so that reading and expanding it stays bounded. No grammar of the
# tests, the benchmarks or Lark's own examples comes near either: the longest is some 4 k
# characters, the deepest nests groups 6 deep.
MAX_GRAMMAR_CHARS = 100_000
MAX_NESTING = 64  # groups, `[...]` and rule references, one inside another

# ---------------------------------------------------------------------------- the tree


@dataclass(frozen=True)
class Literal:
    """A string literal: `text`, case-insensitive with the `i` flag."""

    text: str
    ignore_case: bool
    line: int


@dataclass(frozen=True)
class Pattern:
    """A regex terminal `/source/flags`, `source` already unescaped as Lark does."""

    source: str
    flags: str
    line: int


@dataclass(frozen=True)
class CharRange:
    """`"a".."z"`: one character from `low` to `high`."""

    low: str
    high: str
    line: int


@dataclass(frozen=True)
class Ref:
    """A rule or terminal named in an expansion."""

    name: str
    line: int


@dataclass(frozen=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True)
class Repeat:
    """`node` repeated `low` to `high` times (None: no upper bound)."""

    node: Node
    low: int
    high: int | None


Node = Literal | Pattern | CharRange | Ref | Seq | Alt | Repeat


@dataclass(frozen=True)
class Definition:
    name: str
    body: Node
    line: int

    @property
    def is_terminal(self) -> bool:
        return is_terminal_name(self.name)


@dataclass
class Grammar:
    """What a grammar text defines: its rules and terminals, what `%ignore` skips between
    the tokens of rules, and the `common` terminals it imports (name -> name in common)."""

    definitions: dict[str, Definition] = field(default_factory=dict)
    ignore: list[Node] = field(default_factory=list)
    imports: dict[str, tuple[str, int]] = field(default_factory=dict)


def is_terminal_name(name: str) -> bool:
    return name.lstrip("_")[:1].isupper()


def grammar_error(line: int, problem: str, fix: str) -> ConstraintError:
    """The error for a grammar that cannot be read or compiled: it names the line."""
    return ConstraintError(f"Lark grammar, line {line}: {problem}. {fix.rstrip('.')}.")


# ---------------------------------------------------------------------------- tokens

_TOKEN = re.compile(
    r"""
    (?P<nl_or>(?:[ \t]*(?:(?://|\#)[^\n]*)?\r?\n)+[ \t]*\|)  # a newline continued by '|'
    | (?P<nl>\r?\n)
    | (?P<space>[ \t]+|\\[ \t]*\r?\n)
    | (?P<comment>(?://|\#)[^\n]*)
    | (?P<directive>%[a-z]+)
    | (?P<string>"(?:\\.|[^"\\\n])*"i?)
    | (?P<regexp>/(?!/)(?:\\.|[^/\\\n])+/[imslux]*)
    | (?P<arrow>->)
    | (?P<dotdot>\.\.)
    | (?P<number>[+-]?\d+)
    | (?P<name>_?[A-Za-z][_A-Za-z0-9]*)
    | (?P<op>[:|()\[\]{}?*+~.,!])
    """,
    re.VERBOSE,
)


@dataclass(frozen=True)
class Token:
    kind: str
    text: str
    line: int


def tokenize(text: str) -> list[Token]:
    """The grammar's tokens, with `nl` ending each statement (spaces and comments dropped)."""
    out: list[Token] = []
    line, pos, depth = 1, 0, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise grammar_error(
                line,
                f"unexpected character {quote(text[pos])}",
                "Write rules as `name: ...`, terminals as `NAME: ...`, strings in double quotes "
                "and regexes between slashes",
            )
        kind = m.lastgroup or ""
        value = m.group()
        if kind == "nl_or":
            out.append(Token("op", "|", line + value.count("\n")))
        elif kind == "nl" and depth == 0:
            out.append(Token("nl", "", line))
        elif kind in ("string", "regexp", "directive", "arrow", "dotdot", "number", "name"):
            out.append(Token(kind, value, line))
        elif kind == "op":
            depth += value in "([{"
            depth -= depth > 0 and value in ")]}"
            out.append(Token(kind, value, line))
        line += value.count("\n")
        pos = m.end()
    out.append(Token("nl", "", line))
    return out


# ---------------------------------------------------------------------------- parser


def parse_grammar(text: str) -> Grammar:
    """Read a Lark grammar.

    Raises:
        ConstraintError: what cannot be read, with its line and how to fix it;
            CompileLimitError: a grammar longer than MAX_GRAMMAR_CHARS, or nested deeper
            than MAX_NESTING.
    """
    if len(text) > MAX_GRAMMAR_CHARS:
        raise CompileLimitError(
            f"The Lark grammar is {len(text):,} characters long, over gclm's limit of "
            f"{MAX_GRAMMAR_CHARS:,}. Send a shorter grammar: for a long list of strings, "
            "a regex or a pattern that covers them."
        )
    return _Parser(tokenize(text)).grammar()


def nesting_error(line: int, what: str) -> CompileLimitError:
    """The error of a grammar nested past MAX_NESTING."""
    return CompileLimitError(
        f"Lark grammar, line {line}: {what} nest more than {MAX_NESTING} deep, over gclm's "
        "limit. Flatten the grammar: name the inner parts as rules of their own."
    )


class _Parser:
    def __init__(self, tokens: list[Token]):
        self.tokens = tokens
        self.pos = 0
        self.depth = 0  # groups open around the current atom
        self.result = Grammar()

    # -------------------------------------------------------------- helpers

    def peek(self, offset: int = 0) -> Token:
        return self.tokens[min(self.pos + offset, len(self.tokens) - 1)]

    def take(self) -> Token:
        token = self.peek()
        self.pos += 1
        return token

    def at(self, kind: str, text: str | None = None) -> bool:
        token = self.peek()
        return token.kind == kind and (text is None or token.text == text)

    def expect(self, kind: str, text: str | None, what: str, fix: str) -> Token:
        if not self.at(kind, text):
            raise grammar_error(self.peek().line, f"expected {what}, found {self._seen()}", fix)
        return self.take()

    def _seen(self) -> str:
        token = self.peek()
        return "the end of the line" if token.kind == "nl" else quote(token.text)

    # -------------------------------------------------------------- statements

    def grammar(self) -> Grammar:
        while self.pos < len(self.tokens):
            if self.at("nl"):
                self.take()
                continue
            self.statement()
        return self.result

    def statement(self) -> None:
        token = self.peek()
        if token.kind == "directive":
            self.directive()
            return
        while self.at("op", "?") or self.at("op", "!"):
            self.take()  # tree-shaping modifiers: the language is the same
        name = self.expect(
            "name",
            None,
            "a rule or terminal name",
            "Start each definition with its name, e.g. `start: item+` or `NUMBER: /[0-9]+/`",
        )
        if self.at("op", "{"):
            raise grammar_error(
                name.line,
                f"{quote(name.text)} is a template (`name{{params}}: ...`), which gclm does not "
                "support",
                "Write out one rule per use of the template",
            )
        if self.at("op", "."):
            self.take()
            self.expect("number", None, "a priority number after '.'", "Write e.g. `NAME.2: ...`")
        self.expect(
            "op",
            ":",
            f"':' after {quote(name.text)}",
            "Separate a definition's name from its body with ':', e.g. `start: item+`",
        )
        body = self.expansions()
        self.end_of_statement()
        if name.text in self.result.definitions:
            first = self.result.definitions[name.text].line
            raise grammar_error(
                name.line,
                f"{quote(name.text)} is defined twice (first on line {first})",
                "Merge the definitions into one with '|'",
            )
        self.result.definitions[name.text] = Definition(name.text, body, name.line)

    def end_of_statement(self) -> None:
        self.expect(
            "nl",
            None,
            "the end of the definition",
            "Put each definition on its own line; continue a definition on the next line "
            "with a leading '|'",
        )

    def directive(self) -> None:
        token = self.take()
        if token.text == "%ignore":
            self.result.ignore.append(self.expansions())
            self.end_of_statement()
        elif token.text == "%import":
            self.import_()
        elif token.text in ("%declare", "%override", "%extend"):
            raise grammar_error(
                token.line,
                f"{token.text} is not supported",
                "Define every rule and terminal in full with `name: ...`",
            )
        else:
            raise grammar_error(
                token.line,
                f"unknown directive {quote(token.text)}",
                "The directives gclm reads are %ignore and %import common.NAME",
            )

    def import_(self) -> None:
        line = self.peek().line
        path = [self.expect("name", None, "a module name", _IMPORT_FIX).text]
        while self.at("op", "."):
            self.take()
            path.append(self.expect("name", None, "a name after '.'", _IMPORT_FIX).text)
        if self.at("op", "("):
            module, names = path, []
            self.take()
            while not self.at("op", ")"):
                names.append(self.expect("name", None, "a name to import", _IMPORT_FIX).text)
                if self.at("op", ","):
                    self.take()
            self.take()
            pairs = [(n, n) for n in names]
        else:
            module, pairs = path[:-1], [(path[-1], path[-1])]
            if self.at("arrow"):
                self.take()
                alias = self.expect("name", None, "a name after '->'", _IMPORT_FIX).text
                pairs = [(alias, path[-1])]
        if module != ["common"]:
            raise grammar_error(
                line,
                f"%import of {quote('.'.join(path))}: only Lark's `common` module can be imported",
                "Import from common (e.g. `%import common.NUMBER`) or define the rule in the "
                "grammar",
            )
        self.end_of_statement()
        for local, original in pairs:
            self.result.imports[local] = (original, line)

    # -------------------------------------------------------------- expansions

    def expansions(self) -> Node:
        options = [self.alias()]
        while self.at("op", "|"):
            self.take()
            options.append(self.alias())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def alias(self) -> Node:
        node = self.expansion()
        if self.at("arrow"):
            self.take()  # `-> name` names the tree node; the language is the same
            self.expect("name", None, "a name after '->'", "Write an alias as `... -> name`")
        return node

    def expansion(self) -> Node:
        items: list[Node] = []
        while not (self.at("nl") or self.at("arrow") or any(self.at("op", c) for c in "|)]")):
            items.append(self.expr())
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def expr(self) -> Node:
        node = self.atom()
        if self.at("op", "?"):
            self.take()
            return Repeat(node, 0, 1)
        if self.at("op", "*"):
            self.take()
            return Repeat(node, 0, None)
        if self.at("op", "+"):
            self.take()
            return Repeat(node, 1, None)
        if self.at("op", "~"):
            line = self.take().line
            low = self.count(line)
            high = low
            if self.at("dotdot"):
                self.take()
                high = self.count(line)
            if high < low:
                raise grammar_error(
                    line,
                    f"the repetition `~ {low}..{high}` has its bounds reversed",
                    f"Write `~ {high}..{low}`",
                )
            return Repeat(node, low, high)
        return node

    def count(self, line: int) -> int:
        token = self.expect(
            "number", None, "a count after '~'", "Write `item ~ 3` or `item ~ 2..5`"
        )
        value = int(token.text)
        if value < 0:
            raise grammar_error(line, "a repetition count is negative", "Use counts >= 0")
        if value > MAX_COUNT:
            raise CompileLimitError(
                f"Lark grammar, line {line}: `~ {value}` repeats a part {value:,} times, over "
                f"gclm's limit of {MAX_COUNT:,}: each repetition is automaton states over the "
                "whole vocabulary, so it cannot compile within the compile limits. Use a "
                "smaller count."
            )
        return value

    def atom(self) -> Node:
        token = self.peek()
        if token.kind == "op" and token.text in "([":
            self.take()
            if self.depth >= MAX_NESTING:
                raise nesting_error(token.line, "groups")
            self.depth += 1
            inner = self.expansions()
            self.depth -= 1
            close = ")" if token.text == "(" else "]"
            self.expect(
                "op", close, f"{quote(close)}", f"Close the {quote(token.text)} opened here"
            )
            return inner if token.text == "(" else Repeat(inner, 0, 1)
        if token.kind == "string":
            self.take()
            low = self.literal(token)
            if not self.at("dotdot"):
                return low
            self.take()
            end = self.expect("string", None, "a string after '..'", _RANGE_FIX)
            high = self.literal(end)
            if len(low.text) != 1 or len(high.text) != 1 or low.ignore_case or high.ignore_case:
                raise grammar_error(
                    token.line, "a range needs one character on each side", _RANGE_FIX
                )
            if low.text > high.text:
                raise grammar_error(token.line, "the range's bounds are reversed", _RANGE_FIX)
            return CharRange(low.text, high.text, token.line)
        if token.kind == "regexp":
            self.take()
            return self.pattern(token)
        if token.kind == "name":
            self.take()
            if self.at("op", "{"):
                raise grammar_error(
                    token.line,
                    f"{quote(token.text)}{{...}} uses a template, which gclm does not support",
                    "Write out the rule the template would make",
                )
            return Ref(token.text, token.line)
        raise grammar_error(
            token.line,
            f"expected a string, a regex, a name or a group, found {self._seen()}",
            "Check the operators around it: `|` separates alternatives, `?`, `*`, `+` and "
            "`~ n` follow what they repeat",
        )

    def literal(self, token: Token) -> Literal:
        ignore_case = token.text.endswith("i")
        body = token.text[1 : -2 if ignore_case else -1]
        text = unescape(body, token.line).replace("\\\\", "\\")
        if not text:
            raise grammar_error(
                token.line,
                'an empty string "" (Lark does not allow empty terminals)',
                "Make the part optional with `?` or `[...]` instead",
            )
        return Literal(text, ignore_case, token.line)

    def pattern(self, token: Token) -> Pattern:
        end = token.text.rindex("/")
        source = unescape(token.text[1:end], token.line)
        return Pattern(source, token.text[end + 1 :], token.line)


_IMPORT_FIX = "Write `%import common.NUMBER` or `%import common (NUMBER, WS)`"
_RANGE_FIX = 'Write a range as `"a".."z"`, one character on each side, the smaller first'


def unescape(text: str, line: int) -> str:
    """A literal's or regex's text as Lark reads it (`load_grammar.eval_escaping`): `\\n`,
    `\\t`, `\\f`, `\\r`, `\\xNN`, `\\uNNNN`, `\\UNNNNNNNN` become the character, `\\"` a quote,
    any other escape stays as written."""
    out: list[str] = []
    chars = iter(text)
    for c in chars:
        out.append(c)
        if c == "\\":
            nxt = next(chars, None)
            if nxt is None:
                raise grammar_error(
                    line, "a string ends with a lone backslash", "Write a backslash as \\\\"
                )
            if nxt == "\\":
                out.append("\\\\")
            elif nxt not in "Uuxnftr":
                out.append("\\")
            out.append(nxt)
    joined = "".join(out).replace('\\"', '"').replace("'", "\\'")
    try:
        value = ast.literal_eval(f"u'''{joined}'''")
    except (SyntaxError, ValueError) as e:
        raise grammar_error(
            line,
            f"a bad escape in a string or regex ({e})",
            "Use \\n, \\t, \\xNN, \\uNNNN or a backslash before a quote",
        ) from None
    if not isinstance(value, str):  # pragma: no cover - literal_eval of a str literal
        raise grammar_error(line, "a bad string", "Check its escapes")
    return value
