"""A Lark grammar as frames: its recursive rules kept as calls, for a pushdown mask source.

compiler/front/grammar/lark_regex.py writes a grammar as one regex, unrolling a rule that
calls itself inside its alternatives (`atom: "(" expr ")"`) at most `max_recursion` deep.
Here such a rule is not unrolled: each rule on a cycle of calls (after a rule's own
left- or right-recursion became a repetition, which is exact) is a frame, and a use of it
is a `Call`. What no cycle reaches is written as today: terminals, `%ignore` gaps and
the other rules become regex parts (`Rx`), so a frame's body is a tree of sequences,
alternatives and repetitions over regex parts and calls. Frame 0 is the output: `start`
and the trailing gap.

compiler/grown/pushdown.py makes a byte automaton with a stack of them. A grammar with no
such cycle has no frames past frame 0, and keeps the one-regex path (`grammar_frames`
answers None).
"""

from __future__ import annotations

from dataclasses import dataclass

from gclm.compiler.front.deadline import check
from gclm.compiler.front.grammar.lark_regex import (
    REGEX_BUDGET,
    START,
    _Expander,
    _refs,
    _Scope,
)
from gclm.compiler.front.grammar.rx import Rx
from gclm.compiler.front.grammar.syntax import (
    MAX_NESTING,
    Alt,
    Node,
    Ref,
    Repeat,
    Seq,
    is_terminal_name,
    nesting_error,
    parse_grammar,
)
from gclm.compiler.front.json_schema.calls import FIRST_CALL_CHAR, NEAR_CALLS
from gclm.errors import ConstraintError, quote


@dataclass(frozen=True)
class Call:
    """A use of frame `frame` (a recursive rule)."""

    frame: int


@dataclass(frozen=True)
class Chain:
    items: tuple[Part, ...]


@dataclass(frozen=True)
class Choice:
    options: tuple[Part, ...]


@dataclass(frozen=True)
class Loop:
    """`part` repeated `low` to `high` times (None: no upper bound)."""

    part: Part
    low: int
    high: int | None


Part = Rx | Call | Chain | Choice | Loop


@dataclass(frozen=True)
class GrammarFrames:
    """Frame 0 is the whole output; `names[f]` is frame f's rule (frame 0: `start`) and
    `lines[f]` the line it is defined on. `text_calls`: the regex parts call frame f by
    the character U+F0000 + f (a JSON Schema's frames: compiler/front/json_schema/frames.py)."""

    bodies: tuple[Part | None, ...]  # None: the frame generates no string
    names: tuple[str, ...]
    lines: tuple[int, ...]
    text_calls: bool = False


def recursive_rules(text: str) -> frozenset[str]:
    """The user's rules on a cycle of calls once self-recursion at an alternative's start or
    end became a repetition: the rules the one-regex path would unroll. Raises as
    `check_grammar` does."""
    scope = _Scope(parse_grammar(text))
    scope.check()
    return _cycles(scope)


def grammar_frames(text: str) -> GrammarFrames | None:
    """The frames of the Lark grammar `text`, or None where no rule recurses inside its
    alternatives (then compiler/front/grammar/lark_regex.py's one regex is exact).

    Raises ConstraintError as grammar_regex does (a grammar that does not read, names what
    it does not define, or whose terminals do not compile), and CompileLimitError for
    nesting past MAX_NESTING or a regex part past REGEX_BUDGET characters."""
    scope = _Scope(parse_grammar(text))
    scope.check()
    cycles = _cycles(scope)
    if not cycles:
        return None
    return _Framer(scope, cycles).frames()


def called_frames(pattern: str, grammars: tuple[str, ...]) -> GrammarFrames | None:
    """The frames of a regex that calls Lark grammars (a tool call's, whose custom tools'
    inputs recurse: server/openai/tools/prompt.py): frame 0 is `pattern`, in which the
    character U+F0001 + i stands for an input in `grammars[i]`; frame 1 + i is that
    grammar's output, and the frames of its recursive rules follow. None where a text holds
    a call character of its own, or a grammar has no recursive rule to keep.

    Raises as grammar_frames does."""
    own = {FIRST_CALL_CHAR + 1 + i: None for i in range(len(grammars))}
    if NEAR_CALLS.search(pattern.translate(own)) or any(NEAR_CALLS.search(g) for g in grammars):
        return None
    each = [grammar_frames(g) for g in grammars]
    if any(f is None for f in each):
        return None
    bodies: list[Part | None] = [Rx(pattern, False)]
    names, lines = ["tool call"], [0]
    tails: list[Part | None] = []
    next_frame = 1 + len(grammars)
    for i, frames in enumerate(each):
        assert frames is not None
        moved = {0: 1 + i} | {f: next_frame + f - 1 for f in range(1, len(frames.bodies))}
        next_frame += len(frames.bodies) - 1
        bodies.append(_moved(frames.bodies[0], moved))
        tails += [_moved(b, moved) for b in frames.bodies[1:]]
        names.append(frames.names[0])
        lines.append(frames.lines[0])
    for frames in each:
        assert frames is not None
        names += frames.names[1:]
        lines += frames.lines[1:]
    return GrammarFrames(tuple(bodies + tails), tuple(names), tuple(lines), text_calls=True)


def _moved(part: Part | None, frames: dict[int, int]) -> Part | None:
    """`part` with each call to frame f a call to `frames[f]`."""
    if part is None or isinstance(part, Rx):
        return part
    if isinstance(part, Call):
        return Call(frames[part.frame])
    if isinstance(part, Chain):
        return Chain(tuple(_moved(p, frames) for p in part.items))  # type: ignore[misc]
    if isinstance(part, Choice):
        return Choice(tuple(_moved(p, frames) for p in part.options))  # type: ignore[misc]
    return Loop(_moved(part.part, frames), part.low, part.high)  # type: ignore[arg-type]


def _cycles(scope: _Scope) -> frozenset[str]:
    """The rules that reach themselves through the bodies `scope.body` gives: those in a
    strongly connected component of the call graph with a cycle (Tarjan's algorithm,
    iterative, linear in the grammar)."""
    rules = {name: d for name, d in scope.grammar.definitions.items() if not is_terminal_name(name)}
    calls = {
        name: sorted({r.name for r in _refs(scope.body(("", name), d)) if r.name in rules})
        for name, d in rules.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: set[str] = set()
    for root in rules:
        if root in index:
            continue
        work = [(root, iter(calls[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            name, edges = work[-1]
            callee = next(edges, None)
            if callee is not None:
                if callee not in index:
                    index[callee] = low[callee] = len(index)
                    stack.append(callee)
                    on_stack.add(callee)
                    work.append((callee, iter(calls[callee])))
                elif callee in on_stack:
                    low[name] = min(low[name], index[callee])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[name])
            if low[name] == index[name]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == name:
                        break
                if len(component) > 1 or name in calls[name]:
                    found.update(component)
    return frozenset(found)


class _Framer(_Expander):
    """The expansion of lark_regex.py, with the rules in `cycles` made calls."""

    def __init__(self, scope: _Scope, cycles: frozenset[str]):
        super().__init__(scope, depth=1, budget=REGEX_BUDGET)
        self.cycles = cycles
        self.frame_ids: dict[str, int] = {}
        self.names: list[str] = [START]
        self.todo: list[str] = []
        self.inline: dict[str, Part | None] = {}

    def frames(self) -> GrammarFrames:
        root = self._seq([self.rule(START, 0), self.gaps.trailing()])
        bodies: list[Part | None] = [root]
        while self.todo:
            name = self.todo.pop(0)
            key, d = self.scope.resolve(Ref(name, 0), "")
            bodies.append(self.in_rule(_left_factored(name, self.scope.body(key, d))))
        lines = [self.scope.definition(START).line] + [
            self.scope.definition(n).line for n in self.names[1:]
        ]
        return GrammarFrames(tuple(bodies), tuple(self.names), tuple(lines))

    def rule(self, name: str, line: int) -> Part | None:  # type: ignore[override]
        check()  # a server thread's deadline (compiler/front/deadline.py)
        key, d = self.scope.resolve(Ref(name, line), "")
        if name in self.cycles:
            frame = self.frame_ids.get(name)
            if frame is None:
                frame = self.frame_ids[name] = len(self.names)
                self.names.append(name)
                self.todo.append(name)
            return Call(frame)
        if name in self.inline:
            return self.inline[name]
        if len(self.stack) >= MAX_NESTING:
            raise nesting_error(d.line, "rules that use rules")
        self.stack.append(name)
        try:
            result = self.in_rule(_left_factored(name, self.scope.body(key, d)))
        finally:
            self.stack.pop()
        self.inline[name] = result
        return result

    def in_rule(self, node: Node) -> Part | None:  # type: ignore[override]
        if isinstance(node, Seq):
            return self._seq([self.in_rule(n) for n in node.items])
        if isinstance(node, Alt):
            return self._alt([self.in_rule(n) for n in node.options])
        if isinstance(node, Repeat):
            return self._repeat(self.in_rule(node.node), node.low, node.high)
        if isinstance(node, Ref) and not is_terminal_name(node.name):
            return self.rule(node.name, node.line)
        return super().in_rule(node)

    # Regex parts combine as lark_regex.py's do; a part holding a call stays a tree.

    def _seq(self, parts: list[Part | None]) -> Part | None:
        if any(p is None for p in parts):
            return None
        items: list[Part] = []
        run: list[Rx | None] = []
        for p in parts:
            if isinstance(p, Rx):
                run.append(p)
                continue
            if run:
                joined = self.build.seq(run)
                assert joined is not None
                items.append(joined)
                run = []
            assert p is not None
            items.append(p)
        if run:
            joined = self.build.seq(run)
            assert joined is not None
            items.append(joined)
        items = [p for p in items if not (isinstance(p, Rx) and not p.text)]
        if not items:
            return self.build.seq([])
        return items[0] if len(items) == 1 else Chain(tuple(items))

    def _alt(self, options: list[Part | None]) -> Part | None:
        texts = [o for o in options if isinstance(o, Rx)]
        others = [o for o in options if o is not None and not isinstance(o, Rx)]
        merged = self.build.alt(list(texts)) if texts else None
        kept: list[Part] = ([merged] if merged is not None else []) + others
        if not kept:
            return None
        return kept[0] if len(kept) == 1 else Choice(tuple(kept))

    def _repeat(self, part: Part | None, low: int, high: int | None) -> Part | None:
        if part is None or isinstance(part, Rx):
            return self.build.repeat(part, low, high)
        if high == 0:
            return self.build.seq([])
        if (low, high) == (1, 1):
            return part
        return Loop(part, low, high)


def _left_factored(name: str, body: Node) -> Node:
    """`body` with the alternatives that start with the rule itself made a repetition after
    the others (R = R a | R b | c | d is (c | d) (a | b)*, the same language), where a
    suffix may call the rule again (`cond: cond "AND" cond | atom`, which lark_regex.py's
    `_linear` leaves as written)."""
    options = body.options if isinstance(body, Alt) else (body,)
    suffixes: list[Node] = []
    bases: list[Node] = []
    for option in options:
        items = option.items if isinstance(option, Seq) else (option,)
        if items and isinstance(items[0], Ref) and items[0].name == name:
            if len(items) > 1:
                suffixes.append(Seq(items[1:]))
        else:
            bases.append(option)
    if not suffixes:
        return body
    return Seq((Alt(tuple(bases)), Repeat(Alt(tuple(suffixes)), 0, None)))


def left_recursion_error(frames: GrammarFrames, cycle: list[int]) -> ConstraintError:
    """The error for frames that call each other before any character is written."""
    names = " -> ".join(quote(frames.names[f]) for f in [*cycle, cycle[0]])
    return ConstraintError(
        f"Lark grammar, line {frames.lines[cycle[0]]}: the rules {names} call one another "
        "before any character is written (left recursion through several rules). Write it "
        'with repetition (`expr: term ("+" term)*`) or make one rule call itself first '
        '(`expr: expr "+" term | term`), which gclm turns into a repetition.'
    )
