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
import re
from dataclasses import dataclass
from typing import Any

import outlines_core
from outlines_core.json_schema import build_regex_from_schema

from gclm.compiler.constraint import DEFAULT_WHITESPACE, Constraint
from gclm.compiler.numbers import number_regex
from gclm.compiler.patterns import escape_literal, string_regex
from gclm.compiler.schema import SchemaLimits, normalize_schema
from gclm.compiler.schema_ops import any_node, escape_pointer
from gclm.errors import CompileLimitError, ConstraintError

# json_object allows this many levels of arrays and objects, the outer object included:
# `{"a": {"b": [1]}}` but not `{"a": {"b": [[1]]}}`. Each level multiplies the regex by ~4.
JSON_OBJECT_DEPTH = 3
# A longer regex never compiled within 10 s on the benchmark corpus, and outlines-core
# aborts the process (not an exception) when building a far longer one runs out of memory.
MAX_REGEX_CHARS = 1_000_000


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
    """
    if c.kind == "json_schema":
        schema, rewrites = normalize_schema(json.loads(c.spec), limits)
        if any(b.get("type") == "string" for b in schema.get("anyOf", [schema])):
            rewrites.append(_TOP_STRING_NOTE)
        return RegexResult(_anchor(schema_regex(schema, c.whitespace)), tuple(rewrites))
    if c.kind == "json_object":
        node = {
            "type": "object",
            "additionalProperties": _finished(any_node(JSON_OBJECT_DEPTH - 1)),
        }
        return RegexResult(_anchor(schema_regex(node, c.whitespace)))
    if c.kind == "regex":
        pattern = check_regex(_strip_anchors(c.spec))
        if _matches_empty(pattern):
            raise ConstraintError(
                f"The regex {c.spec!r} matches the empty string, which gclm cannot compile "
                "faithfully (outlines-core 0.2.14 would drop longer outputs). Require at least "
                "one character, e.g. 'x+' instead of 'x*'."
            )
        return RegexResult(_anchor(pattern))
    choices = json.loads(c.spec)
    if "" in choices:
        raise ConstraintError("An empty string is not a supported choice; remove it.")
    return RegexResult(_anchor("|".join(escape_literal(x) for x in choices)))


_TOP_STRING_NOTE = (
    "/: a string that is the whole output is generated without '\"' in it "
    "(outlines-core's automaton for it grows exponentially otherwise)"
)


def _anchor(regex: str) -> str:
    """End-anchor `regex` (see the module docstring). The regex must not match the empty
    string: outlines-core cannot index a `$` reachable before any character."""
    return f"(?:{regex})$"


def _matches_empty(pattern: str) -> bool:
    try:
        return re.fullmatch(pattern, "") is not None
    except re.error:
        return False  # Rust-only syntax: assume not; the compile stage reports otherwise


def _finished(node: dict[str, Any]) -> dict[str, Any]:
    """any_node's objects in the outlines-core form (no declared properties)."""
    if "anyOf" in node:
        return {"anyOf": [_finished(b) for b in node["anyOf"]]}
    if node["type"] == "object":
        return {"type": "object", "additionalProperties": _finished(node["additionalProperties"])}
    if node["type"] == "array":
        return {"type": "array", "items": _finished(node["items"])}
    return node


def schema_regex(schema: dict[str, Any], whitespace: str = DEFAULT_WHITESPACE) -> str:
    """Build the regex for a normalised schema with outlines-core, splicing in gclm's leaves.

    Leaves outlines-core gets wrong (bounded numbers, patterns, formats) become string
    constants that cannot occur elsewhere in the schema; their regexes replace the
    constants' text in outlines-core's output.
    """
    size = _regex_size(schema, {})
    if size > MAX_REGEX_CHARS:
        raise CompileLimitError(
            f"The schema expands to a regex of about {size:,} characters (limit "
            f"{MAX_REGEX_CHARS:,}); no automaton that size compiles in time. Reduce nesting, "
            "recursion or repeated $refs."
        )
    text = json.dumps(schema, ensure_ascii=False)
    nonce = 0
    while f"gclm{nonce}x" in text:
        nonce += 1
    leaves: dict[str, str] = {}
    top = schema["anyOf"] if "anyOf" in schema else [schema]
    prepared = _prepare(schema, "", f"gclm{nonce}x", leaves, top=[id(n) for n in top])
    try:
        regex = build_regex_from_schema(json.dumps(prepared, ensure_ascii=False), whitespace)
    except (ValueError, RuntimeError) as e:
        raise ConstraintError(f"outlines-core could not turn the schema into a regex: {e}") from e
    for placeholder, leaf in leaves.items():
        quoted = f'"{placeholder}"'
        if quoted not in regex:
            raise ConstraintError(
                f"Internal: leaf {placeholder} vanished from outlines-core's regex."
            )
        regex = regex.replace(quoted, f"(?:{leaf})")
    return regex


def _regex_size(node: Any, memo: dict[int, int]) -> int:
    """Roughly how long outlines-core's regex for a normalised node will be.

    It writes an array's item and a free-key object's value twice, and with no required
    property it repeats property i in n - i alternatives (quadratic in optional properties).
    """
    if not isinstance(node, dict):
        return 0
    if id(node) in memo:
        return memo[id(node)]
    size = 60 + len(json.dumps(node.get("enum", "")))
    for key in ("items", "additionalProperties"):
        size += 2 * _regex_size(node.get(key), memo)
    for sub in node.get("anyOf", []) + node.get("prefixItems", []):
        size += _regex_size(sub, memo)
    props = list(node.get("properties", {}).values())
    for i, sub in enumerate(props):
        size += _regex_size(sub, memo) * (1 if node.get("required") else len(props) - i)
    memo[id(node)] = size
    return size


def _prepare(node: Any, ptr: str, prefix: str, leaves: dict[str, str], top: list[int]) -> Any:
    """Copy `node` for outlines-core: leaves become placeholders, keys get JSON escapes.

    `top` holds the ids of the nodes that are the whole output (see `string_regex`).
    """
    if isinstance(node, list):
        return [_prepare(x, f"{ptr}/{i}", prefix, leaves, top) for i, x in enumerate(node)]
    if not isinstance(node, dict) or "enum" in node:
        return node
    leaf = None
    if node.get("type") in ("integer", "number"):
        leaf = number_regex(node, ptr)
    elif node.get("type") == "string":
        leaf = string_regex(node, ptr, top_level=id(node) in top)
    if leaf is not None:
        placeholder = f"{prefix}{len(leaves)}"
        leaves[placeholder] = leaf
        return {"const": placeholder}
    out = {}
    for key, value in node.items():
        if key == "properties":
            # outlines-core regex-escapes a name but does not JSON-escape it.
            out[key] = {
                _json_escaped(k): _prepare(
                    v, f"{ptr}/properties/{escape_pointer(k)}", prefix, leaves, top
                )
                for k, v in value.items()
            }
        elif key == "required":
            out[key] = [_json_escaped(k) for k in value]
        else:
            out[key] = _prepare(value, f"{ptr}/{key}", prefix, leaves, top)
    return out


def _json_escaped(name: str) -> str:
    return json.dumps(name, ensure_ascii=False)[1:-1]


def _strip_anchors(pattern: str) -> str:
    """Drop a leading `^` and a trailing `$`: outlines-core matches the whole output anyway.

    A leading `^` must go: outlines-core cannot build an Index for a regex whose start
    state depends on look-behind ("anchored universal start state doesn't exist").
    """
    if pattern.startswith("^"):
        pattern = pattern[1:]
    trailing_backslashes = len(pattern[:-1]) - len(pattern[:-1].rstrip("\\"))
    if pattern.endswith("$") and trailing_backslashes % 2 == 0:
        pattern = pattern[:-1]
    return pattern


_PROBE_VOCABULARY: outlines_core.Vocabulary | None = None


def check_regex(pattern: str) -> str:
    """Return `pattern` if it compiles in outlines-core's dialect (Rust `regex`), else raise.

    Compiles `(?:pattern){0}`: the parser checks all of it, and the empty repetition keeps
    the DFA (the slow part, done later by the compile stage) to one state.

    Raises:
        ConstraintError: the regex does not compile, with the likely reason.
    """
    global _PROBE_VOCABULARY
    if _PROBE_VOCABULARY is None:
        _PROBE_VOCABULARY = outlines_core.Vocabulary(1, {"\x00": [0]})
    problem = _unbalanced(pattern)
    if problem is None and re.search(r"(?<!\\)(?:\\\\)*\\[bB]", pattern):
        # The probe drops the body before the DFA is built, so this would surface later.
        problem = "Unicode word boundaries ('\\b') cannot be compiled to a DFA; use (?-u:\\b)"
    if problem is None:
        try:
            outlines_core.Index(f"(?:{pattern}){{0}}", _PROBE_VOCABULARY)
        except ValueError as e:
            if "Failed to build DFA" in str(e):
                problem = _diagnose(pattern)
    if problem is not None:
        raise ConstraintError(
            f"The regex {pattern!r} does not compile: {problem}. gclm uses Rust regex syntax "
            "(https://docs.rs/regex), without look-around or backreferences."
        )
    return pattern


def _unbalanced(pattern: str) -> str | None:
    """A reason if parentheses outside classes do not balance (the probe's group would hide
    it), or if a start anchor is left inside the pattern (outlines-core cannot index it)."""
    depth, i, in_class = 0, 0, 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            if pattern[i + 1 : i + 2] == "A" and not in_class:
                return "a '\\A' anchor inside the regex (the whole output is matched; remove it)"
            i += 2
            continue
        if ch == "[":
            in_class += 1
            # A `]` right after `[` or `[^` is a literal, not the end of the class.
            i += 3 if pattern[i + 1 : i + 3] == "^]" else 2 if pattern[i + 1 : i + 2] == "]" else 1
            continue
        if ch == "]" and in_class:
            in_class -= 1
        elif ch == "^" and not in_class:
            return "a '^' anchor inside the regex (the whole output is matched; remove it)"
        elif ch == "(" and not in_class:
            depth += 1
        elif ch == ")" and not in_class:
            depth -= 1
            if depth < 0:
                return "an unmatched ')'"
        i += 1
    return "an unclosed '('" if depth > 0 else None


def _diagnose(pattern: str) -> str:
    checks = [
        ("(?=", "look-ahead '(?=' is not supported"),
        ("(?!", "look-ahead '(?!' is not supported"),
        ("(?<=", "look-behind '(?<=' is not supported"),
        ("(?<!", "look-behind '(?<!' is not supported"),
    ]
    for needle, reason in checks:
        if needle in pattern:
            return reason
    if re.search(r"(?<!\\)(?:\\\\)*\\[1-9]", pattern):
        return "backreferences like '\\1' are not supported"
    try:
        re.compile(pattern)
    except re.error as e:
        return f"a syntax error ({e})"
    return "a syntax error"
