"""Turn a Constraint into the regex outlines-core compiles into an Index.

Every regex ends with `$`. outlines-core 0.2.14 builds its Index from a regex-automata DFA
that reports a match one byte late, and it drops any token whose bytes pass through such a
late match without completing another one: `a(bc)?` alone never lets `abc` through, nor
`[0-9]+(\\.[0-9]+)?` the text `1.5`. With `$` a match can only end at the end of the
output, so no transition is dropped. The `$` must not be reachable before the first
character (outlines-core then finds no start state), so a regex or choice that matches the
empty string is refused: after an empty match every longer output would be dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.grammar import grammar_regex
from gclm.compiler.front.json_schema.normalize import SchemaLimits, normalize_schema
from gclm.compiler.front.json_schema.objects import FREE_FORM_NOTE
from gclm.compiler.front.json_schema.patterns import escape_literal
from gclm.compiler.front.json_schema.regex import json_object_regex, schema_regex
from gclm.compiler.front.rust_regex import check_regex, matches_empty, strip_anchors
from gclm.errors import CompileLimitError, ConstraintError, quote

# A schema whose regex, with free-form objects nested SchemaLimits.free_object_depth deep,
# is longer than this (or over the regex limit) is built again with them as shallow as
# `{}` values: each deeper free-form object adds ~10k characters and up to ~3k automaton
# states (MaskBench kb_308, 12 free-form objects: 211k characters, 3.8k states and 0.7 s to
# compile; 633k, 6.8k and 2.6 s deeper).
FREE_DEPTH_BUDGET = 700_000


@dataclass(frozen=True)
class RegexResult:
    """The regex for a constraint and what normalisation changed to get it."""

    regex: str
    rewrites: tuple[str, ...] = ()


def to_regex(c: Constraint, limits: SchemaLimits | None = None) -> RegexResult:
    """The regex (Rust `regex` syntax) whose full matches are the constraint's outputs.

    `limits` bounds what a JSON Schema may expand to (see SchemaLimits).

    Raises:
        UnsupportedSchemaError: a schema keyword gclm cannot honour.
        ConstraintError: an invalid schema, a regex that does not compile, or no choices.
        CompileLimitError: a constraint nested past the limits (MAX_SCHEMA_DEPTH, the
            grammar's MAX_NESTING), or whose expansion recurses past Python's stack.
    """
    try:
        return _to_regex(c, limits)
    except RecursionError:  # a backstop: the explicit limits refuse what tests reach
        raise _too_deep(c) from None


def _too_deep(c: Constraint) -> CompileLimitError:
    return CompileLimitError(
        f"The {c.kind.replace('_', ' ')} nests too deeply to compile (its parts, or a chain "
        "of $refs or rules, one inside another). Flatten it."
    )


def _to_regex(c: Constraint, limits: SchemaLimits | None) -> RegexResult:
    if c.kind in JSON_KINDS:
        result = json_regex(c, limits)
        return RegexResult(_anchor(result.regex), result.rewrites)
    if c.kind == "regex":
        pattern = check_regex(strip_anchors(c.spec))
        if matches_empty(pattern):
            raise ConstraintError(
                f"The regex {quote(c.spec)} matches the empty string, which gclm cannot compile "
                "faithfully (outlines-core 0.2.14 would drop longer outputs). Require at least "
                "one character, e.g. 'x+' instead of 'x*'."
            )
        return RegexResult(_anchor(pattern))
    if c.kind == "grammar":
        grammar = grammar_regex(c.spec)
        return RegexResult(_anchor(grammar.regex), grammar.notes)
    choices = json.loads(c.spec)
    if "" in choices:
        raise ConstraintError("An empty string is not a supported choice; remove it.")
    return RegexResult(_anchor("|".join(escape_literal(x) for x in choices)))


JSON_KINDS = ("json_schema", "json_object")
# JSON objects and arrays one inside another in a schema as sent. Normalising recurses on
# them (and refuses past 200 levels once $refs are expanded); deeper input ran out of
# Python's stack before that check could say so.
MAX_SCHEMA_DEPTH = 256


def check_depth(schema: object) -> None:
    """Refuse a schema nested past MAX_SCHEMA_DEPTH (counted without recursion)."""
    todo: list[tuple[object, int]] = [(schema, 1)]
    while todo:
        value, depth = todo.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise CompileLimitError(
                f"The JSON Schema nests more than {MAX_SCHEMA_DEPTH} levels of JSON objects "
                "and arrays, over gclm's limit. Flatten it: name the repeated parts in $defs."
            )
        if isinstance(value, dict):
            todo.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            todo.extend((v, depth + 1) for v in value)


def json_regex(c: Constraint, limits: SchemaLimits | None = None) -> RegexResult:
    """The regex of a JSON constraint (kind in JSON_KINDS), not anchored: a part that a
    larger regex can hold (the text branch of a tool constraint). Its outputs are JSON
    texts, so they start with `{`, `[`, `"`, a digit, `-`, a letter of true/false/null or a
    space, never with `<`.

    Raises as to_regex does.
    """
    if c.kind == "json_object":
        return RegexResult(json_object_regex(c.whitespace))
    if c.kind != "json_schema":
        raise ValueError(f"json_regex takes a JSON constraint, not {c.kind!r}")
    try:
        return _json_schema_regex(c, limits or SchemaLimits())
    except RecursionError:  # as in to_regex
        raise _too_deep(c) from None


def _json_schema_regex(c: Constraint, limits: SchemaLimits) -> RegexResult:
    check_depth(json.loads(c.spec))
    schema, rewrites = normalize_schema(
        json.loads(c.spec), limits, additional_properties=c.additional_properties
    )
    try:
        regex: str | None = schema_regex(schema, c.whitespace)
    except CompileLimitError:
        regex = None
    deeper = any(FREE_FORM_NOTE in line for line in rewrites)  # else shallower is the same
    if deeper and (regex is None or len(regex) > FREE_DEPTH_BUDGET):
        # Deeper free-form objects cost too much here: nest them as `{}` values instead.
        shallow, rewrites = normalize_schema(
            json.loads(c.spec),
            replace(limits, free_object_depth=limits.any_depth),
            additional_properties=c.additional_properties,
        )
        if shallow != schema:  # else its regex is the one built (Github_ultra o6354's)
            schema, regex = shallow, None
    if regex is None:
        regex = schema_regex(schema, c.whitespace)
    if any(b.get("type") == "string" for b in schema.get("anyOf", [schema])):
        rewrites.append(_TOP_STRING_NOTE)
    return RegexResult(regex, tuple(rewrites))


_TOP_STRING_NOTE = (
    "/: a string that is the whole output is generated without '\"' in it "
    "(outlines-core's automaton for it grows exponentially otherwise)"
)


def _anchor(regex: str) -> str:
    """End-anchor `regex` (see the module docstring). The regex must not match the empty
    string: outlines-core cannot index a `$` reachable before any character."""
    return f"(?:{regex})$"
