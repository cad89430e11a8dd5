"""A Lark grammar as one regex: the strings of its language that gclm generates.

Terminals are inlined; in the rules, what `%ignore` names may come before, between and
after tokens, as Lark's lexer skips it. A rule that calls itself only at the start or the
end of its alternatives (`list: list "," item | item`) becomes a repetition, which is
exact. Any other recursion (`atom: "(" expr ")"`) is unrolled: a rule is expanded at most
`max_recursion` times inside itself, deeper nesting is not generated, and a note says so,
as for a recursive JSON Schema `$ref`. If the regex would pass `regex_budget` characters,
the nesting is made shallower (down to 1) before the grammar is refused.

Every string the regex matches is one Lark's Earley parser accepts (with the
`dynamic_complete` lexer, which tries every split of the text into tokens).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from gclm.compiler.front.deadline import check
from gclm.compiler.front.grammar.common import COMMON
from gclm.compiler.front.grammar.gaps import Gaps
from gclm.compiler.front.grammar.python_regex import (
    RegexProblem,
    literal_regex,
    range_regex,
    translate,
)
from gclm.compiler.front.grammar.rx import EMPTY, Builder, RegexTooLong, Rx, raw
from gclm.compiler.front.grammar.syntax import (
    MAX_NESTING,
    Alt,
    CharRange,
    Definition,
    Grammar,
    Literal,
    Node,
    Pattern,
    Ref,
    Repeat,
    Seq,
    grammar_error,
    is_terminal_name,
    nesting_error,
    parse_grammar,
)
from gclm.errors import CompileLimitError, ConstraintError, quote

START = "start"
# Past this the regex is built again with shallower nesting; outlines-core's automaton
# builder and the token walk take seconds from about here (the JSON Schema side's
# FREE_DEPTH_BUDGET).
REGEX_BUDGET = 700_000


@dataclass(frozen=True)
class GrammarLimits:
    """max_recursion: how many times a rule may be expanded inside itself (as a recursive
    JSON Schema `$ref` is); regex_budget: the regex length past which nesting is lowered."""

    max_recursion: int = 3
    regex_budget: int = REGEX_BUDGET


@dataclass(frozen=True)
class GrammarRegex:
    """The regex of a grammar (not anchored) and the notes on what it leaves out."""

    regex: str
    notes: tuple[str, ...] = ()
    depth: int | None = None  # the nesting of recursive rules, None: none is unrolled


def grammar_regex(text: str, limits: GrammarLimits | None = None) -> GrammarRegex:
    """The regex (Rust `regex` syntax) of the Lark grammar `text`, from its rule `start`.

    Raises:
        ConstraintError: the grammar does not parse, names what it does not define, uses
            a construct a DFA cannot hold, generates no string or the empty string (each
            message names the line and the fix); CompileLimitError if even nesting 1 deep
            is over the regex budget.
    """
    limits = limits or GrammarLimits()
    grammar = parse_grammar(text)
    scope = _Scope(grammar)
    scope.check()
    depth = limits.max_recursion
    while True:
        expander = _Expander(scope, depth, limits.regex_budget)
        try:
            result = expander.start()
            break
        except RegexTooLong:
            if depth <= 1 or not expander.cut:
                raise CompileLimitError(
                    f"The grammar's regex is over gclm's limit of {limits.regex_budget:,} "
                    "characters"
                    + (" even with recursive rules nested 1 deep" if expander.cut else "")
                    + ": no automaton that size compiles in time. Use fewer alternatives, "
                    "smaller counts or less nesting."
                ) from None
            depth -= 1
    if result is None:
        raise ConstraintError(
            "The Lark grammar's start rule generates no string: every alternative calls a "
            "rule that never ends (a recursion with no alternative that stops it). Give each "
            "recursive rule an alternative without itself.",
        )
    if result.nullable:
        raise ConstraintError(
            "The Lark grammar matches the empty string, which gclm cannot compile faithfully "
            "(outlines-core 0.2.14 would drop longer outputs). Make `start` need at least one "
            "token, e.g. `item+` instead of `item*`.",
        )
    notes = tuple(
        f"line {scope.definition(name).line}: rule {quote(name)} is recursive; it is nested "
        f"at most {depth} deep, deeper nesting is not generated"
        for name in sorted(expander.cut, key=lambda n: scope.definition(n).line)
    )
    return GrammarRegex(result.text, notes, depth if expander.cut else None)


def check_grammar(text: str) -> None:
    """Refuse a grammar that does not read or names what it does not define (what
    grammar_regex refuses before it builds anything).

    Raises:
        ConstraintError: as grammar_regex does, with the line.
    """
    _Scope(parse_grammar(text)).check()


# ---------------------------------------------------------------------------- names


@functools.cache
def _common() -> Grammar:
    return parse_grammar(COMMON)


# A definition's key: (module, name); module "" is the user's grammar, "common" Lark's.
Key = tuple[str, str]


class _Scope:
    """Resolves names to definitions, the user's and the imported `common` ones."""

    def __init__(self, grammar: Grammar):
        self.grammar = grammar
        self.common = _common()
        # The rules each rule reaches, itself included when it is recursive.
        self._reach: dict[str, frozenset[str]] = {}
        self.bodies: dict[Key, Node] = {}

    def definition(self, name: str, module: str = "") -> Definition:
        return self.resolve(Ref(name, 0), module)[1]

    def resolve(self, ref: Ref, module: str) -> tuple[Key, Definition]:
        if module == "common":
            return ("common", ref.name), self.common.definitions[ref.name]
        if ref.name in self.grammar.definitions:
            return ("", ref.name), self.grammar.definitions[ref.name]
        if ref.name in self.grammar.imports:
            original, line = self.grammar.imports[ref.name]
            if original not in self.common.definitions:
                raise grammar_error(
                    line,
                    f"common has no terminal {quote(original)}",
                    "Lark's common module defines "
                    + ", ".join(n for n in self.common.definitions if not n.startswith("_")),
                )
            return ("common", original), self.common.definitions[original]
        kind = "terminal" if is_terminal_name(ref.name) else "rule"
        raise grammar_error(
            ref.line,
            f"the {kind} {quote(ref.name)} is not defined",
            f"Define it (`{ref.name}: ...`)"
            + (f" or import it (`%import common.{ref.name}`)" if kind == "terminal" else ""),
        )

    def check(self) -> None:
        """Every definition names only what exists, terminals name no rules, names are
        Lark's (lowercase rules, uppercase terminals), and `start` is there."""
        for local, (_, line) in self.grammar.imports.items():
            if local in self.grammar.definitions:
                raise grammar_error(
                    line, f"{quote(local)} is both imported and defined", "Keep one of the two"
                )
            self.resolve(Ref(local, line), "")
        for d in self.grammar.definitions.values():
            _check_name(d.name, d.line)
            for ref in _refs(d.body):
                _check_name(ref.name, ref.line)
                self.resolve(ref, "")
                if d.is_terminal and not is_terminal_name(ref.name):
                    raise grammar_error(
                        ref.line,
                        f"the terminal {quote(d.name)} uses the rule {quote(ref.name)}",
                        "Terminals may use only strings, regexes and other terminals; make "
                        f"{quote(d.name)} a rule (a lowercase name)",
                    )
        for node in self.grammar.ignore:
            for ref in _refs(node):
                if not is_terminal_name(ref.name):
                    raise grammar_error(
                        ref.line,
                        f"%ignore names the rule {quote(ref.name)}",
                        "%ignore takes terminals, strings or regexes (e.g. `%ignore WS`)",
                    )
                self.resolve(ref, "")
        start = self.grammar.definitions.get(START)
        if start is None:
            raise ConstraintError(
                "The Lark grammar has no rule named 'start'; generation begins there. Add "
                "`start: ...`.",
            )

    def reach(self, name: str) -> frozenset[str]:
        """The user's rules reachable from rule `name` in one or more steps."""
        if name not in self._reach:
            seen: set[str] = set()
            todo = [name]
            while todo:
                for ref in _refs(self.grammar.definitions[todo.pop()].body):
                    if ref.name in self.grammar.definitions and not is_terminal_name(ref.name):
                        if ref.name not in seen:
                            seen.add(ref.name)
                            todo.append(ref.name)
            self._reach[name] = frozenset(seen)
        return self._reach[name]

    def body(self, key: Key, d: Definition) -> Node:
        """A definition's body, a rule's linear self-recursion made a repetition."""
        if key not in self.bodies:
            self.bodies[key] = d.body if d.is_terminal else _linear(d)
        return self.bodies[key]


def _check_name(name: str, line: int) -> None:
    letters = name.lstrip("_")
    if letters != letters.lower() and letters != letters.upper():
        raise grammar_error(
            line,
            f"the name {quote(name)} mixes cases",
            "Name rules in lowercase and terminals in uppercase, as Lark requires",
        )


def _refs(node: Node) -> list[Ref]:
    if isinstance(node, Ref):
        return [node]
    if isinstance(node, Seq):
        return [r for item in node.items for r in _refs(item)]
    if isinstance(node, Alt):
        return [r for option in node.options for r in _refs(option)]
    if isinstance(node, Repeat):
        return _refs(node.node)
    return []


def _linear(d: Definition) -> Node:
    """`d`'s body with its self-recursion turned into repetition when every call to itself
    is the first or the last item of an alternative (Arden's rule: R = A R | R C | B is
    A* B C*); otherwise the body as written."""
    options = d.body.options if isinstance(d.body, Alt) else (d.body,)
    prefixes: list[Node] = []
    suffixes: list[Node] = []
    bases: list[Node] = []
    for option in options:
        items = option.items if isinstance(option, Seq) else (option,)
        calls = sum(r.name == d.name for r in _refs(option))
        if calls == 0:
            bases.append(option)
        elif calls > 1:
            return d.body
        elif len(items) == 1 and _is_self(items[0], d.name):
            continue  # `R: R`: adds nothing
        elif _is_self(items[-1], d.name):
            prefixes.append(Seq(items[:-1]))
        elif _is_self(items[0], d.name):
            suffixes.append(Seq(items[1:]))
        else:
            return d.body
    if not prefixes and not suffixes:
        return d.body
    if not bases:
        return Alt(())
    return Seq(
        (
            Repeat(Alt(tuple(prefixes)), 0, None) if prefixes else Seq(()),
            Alt(tuple(bases)),
            Repeat(Alt(tuple(suffixes)), 0, None) if suffixes else Seq(()),
        )
    )


def _is_self(node: Node, name: str) -> bool:
    return isinstance(node, Ref) and node.name == name


# ---------------------------------------------------------------------------- expansion


class _Expander:
    """Builds the regex from `start` with rules nested at most `depth` deep."""

    def __init__(self, scope: _Scope, depth: int, budget: int):
        self.scope = scope
        self.depth = depth
        self.build = Builder(budget)
        self.stack: list[str] = []
        self.counts: dict[str, int] = {}  # how often each rule is on `stack`
        self.cut: set[str] = set()
        self.rules: dict[tuple[str, tuple[tuple[str, int], ...]], Rx | None] = {}
        self.terminals: dict[Key, Rx | None] = {}
        self.terminal_stack: list[Key] = []
        pieces = [self.token(node, "", _line(node)) for node in scope.grammar.ignore]
        self.gaps = Gaps([p for p in pieces if p is not None], self.build)

    def start(self) -> Rx | None:
        body = self.rule(START, 0)
        return self.build.seq([body, self.gaps.trailing()])

    # -------------------------------------------------------------- rules

    def rule(self, name: str, line: int) -> Rx | None:
        check()  # a server thread's deadline (compiler/front/deadline.py)
        key, d = self.scope.resolve(Ref(name, line), "")
        if self.counts.get(name, 0) >= self.depth:
            self.cut.add(name)
            return None
        if len(self.stack) >= MAX_NESTING:
            raise nesting_error(d.line, "rules that use rules")
        reach = self.scope.reach(name)
        # The expansion depends on how often each rule it reaches is open around it.
        memo = (name, tuple(sorted((r, n) for r, n in self.counts.items() if n and r in reach)))
        if memo in self.rules:
            return self.rules[memo]
        self.stack.append(name)
        self.counts[name] = self.counts.get(name, 0) + 1
        try:
            result = self.in_rule(self.scope.body(key, d))
        finally:
            self.stack.pop()
            self.counts[name] -= 1
        self.rules[memo] = result
        return result

    def in_rule(self, node: Node) -> Rx | None:
        """A rule's expansion: rules recurse, everything else is a token."""
        if isinstance(node, Seq):
            return self.build.seq([self.in_rule(n) for n in node.items])
        if isinstance(node, Alt):
            return self.build.alt([self.in_rule(n) for n in node.options])
        if isinstance(node, Repeat):
            return self.build.repeat(self.in_rule(node.node), node.low, node.high)
        if isinstance(node, Ref) and not is_terminal_name(node.name):
            return self.rule(node.name, node.line)
        token = self.token(node, "", _line(node))
        if token is None:
            return None
        return self.build.seq([self.gaps.before(token), token])

    # -------------------------------------------------------------- terminals

    def token(self, node: Node, module: str, line: int) -> Rx | None:
        """A token of a rule (or of %ignore): Lark refuses one that matches nothing."""
        rx = self.in_terminal(node, module)
        if rx is not None and rx.nullable:
            what = f"the terminal {quote(node.name)}" if isinstance(node, Ref) else "a token"
            raise grammar_error(
                line,
                f"{what} can match the empty string, which Lark does not allow in a terminal",
                "Make it match at least one character and mark its use optional with `?`",
            )
        return rx

    def in_terminal(self, node: Node, module: str) -> Rx | None:
        if isinstance(node, Seq):
            return self.build.seq([self.in_terminal(n, module) for n in node.items])
        if isinstance(node, Alt):
            return self.build.alt([self.in_terminal(n, module) for n in node.options])
        if isinstance(node, Repeat):
            return self.build.repeat(self.in_terminal(node.node, module), node.low, node.high)
        if isinstance(node, Literal):
            text = literal_regex(node.text, node.ignore_case)
            return Rx(text, False, atomic=True) if len(node.text) == 1 else raw(text, False)
        if isinstance(node, CharRange):
            return Rx(range_regex(node.low, node.high), False, atomic=True)
        if isinstance(node, Pattern):
            try:
                text, nullable = translate(node.source, node.flags)
            except RegexProblem as e:
                raise grammar_error(
                    node.line,
                    f"the regex /{node.source}/{node.flags} cannot be compiled: {e}",
                    "Rewrite it with characters, classes, groups, alternation and repeats",
                ) from None
            return raw(text, nullable) if text else EMPTY
        if isinstance(node, Ref):
            return self.terminal(node, module)
        raise TypeError(f"unexpected grammar node {node!r}")  # pragma: no cover

    def terminal(self, ref: Ref, module: str) -> Rx | None:
        key, d = self.scope.resolve(ref, module)
        if key in self.terminals:
            return self.terminals[key]
        if key in self.terminal_stack:
            raise grammar_error(
                d.line,
                f"the terminal {quote(d.name)} is recursive",
                "A terminal must be regular: make it a rule (a lowercase name)",
            )
        if len(self.terminal_stack) >= MAX_NESTING:
            raise nesting_error(d.line, "terminals that use terminals")
        self.terminal_stack.append(key)
        try:
            result = self.in_terminal(d.body, key[0])
        finally:
            self.terminal_stack.pop()
        self.terminals[key] = result
        return result


def _line(node: Node) -> int:
    """The line of a node's first name, string or regex (0: none)."""
    if isinstance(node, Seq):
        return _line(node.items[0]) if node.items else 0
    if isinstance(node, Alt):
        return _line(node.options[0]) if node.options else 0
    if isinstance(node, Repeat):
        return _line(node.node)
    return node.line
