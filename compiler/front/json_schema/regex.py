"""A normalised JSON Schema -> the regex outlines-core compiles, with gclm's own leaves.

outlines-core's `build_regex_from_schema` writes the structure (objects, arrays, unions);
gclm writes the leaves it gets wrong (bounded numbers, patterns, formats) and splices them in.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from outlines_core.json_schema import build_regex_from_schema

from gclm.compiler.front.constraint import DEFAULT_WHITESPACE
from gclm.compiler.front.json_schema.calls import FrameCall, OpaqueCall, call_char, without_calls
from gclm.compiler.front.json_schema.numbers import number_regex
from gclm.compiler.front.json_schema.open_objects import (
    counted_object_regex,
    keyed_object_regex,
    open_object_regex,
)
from gclm.compiler.front.json_schema.ops import any_node, escape_pointer
from gclm.compiler.front.json_schema.patterns import (
    JSON_CHAR,
    JSON_CHAR_SHORT,
    OUTLINES_JSON_CHAR,
    escape_literal,
    pattern_regex,
    string_regex,
)
from gclm.errors import CompileLimitError, ConstraintError, GclmError

log = logging.getLogger("gclm.compiler")

# json_object allows this many levels of arrays and objects, the outer object included:
# `{"a": {"b": [1]}}` but not `{"a": {"b": [[1]]}}`. Each level multiplies the regex by ~4.
JSON_OBJECT_DEPTH = 3
# outlines-core aborts the process (not an exception) when building a far longer regex
# runs out of memory. With the token walk (compiler/whole/token_walk.py), MaskBench's
# Kubernetes kb_449 (1.3 M characters) and kb_1112 (2.4 M) compile in 6-16 s on a loaded
# 2-core machine; kb_233 (5.6 M) took 77 s and 2.3 GB: refused at once here instead.
MAX_REGEX_CHARS = 3_000_000
# serde_json (under outlines-core) reads at most this many nested objects and arrays.
MAX_JSON_DEPTH = 127


def json_object_regex(whitespace: str = DEFAULT_WHITESPACE) -> str:
    """The regex of `response_format: json_object`: any object nested JSON_OBJECT_DEPTH deep."""
    node = {"type": "object", "additionalProperties": _finished(any_node(JSON_OBJECT_DEPTH - 1))}
    return schema_regex(node, whitespace)


def _finished(node: dict[str, Any]) -> dict[str, Any]:
    """any_node's objects in the outlines-core form (no declared properties)."""
    if "anyOf" in node:
        return {"anyOf": [_finished(b) for b in node["anyOf"]]}
    if node["type"] == "object":
        return {"type": "object", "additionalProperties": _finished(node["additionalProperties"])}
    if node["type"] == "array":
        return {"type": "array", "items": _finished(node["items"])}
    return node


def _json_depth(value: Any) -> int:
    """Levels of objects and arrays in `value` (a scalar: 0), without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        node, depth = todo.pop()
        children = node.values() if isinstance(node, dict) else node
        if isinstance(node, dict | list):
            deepest = max(deepest, depth)
            todo += [(child, depth + 1) for child in children]
    return deepest


def schema_regex(
    schema: dict[str, Any], whitespace: str = DEFAULT_WHITESPACE, top_level: bool = True
) -> str:
    """Build the regex for a normalised schema with outlines-core, splicing in gclm's leaves.

    Leaves outlines-core gets wrong (bounded numbers, patterns, formats, objects whose
    undeclared keys must match a pattern) become string constants that cannot occur
    elsewhere in the schema; their regexes replace the constants' text in outlines-core's
    output. `top_level=False`: the schema is part of a larger output (see `string_regex`).
    """
    size = regex_size(schema, {})
    if size > MAX_REGEX_CHARS:
        raise CompileLimitError(
            f"The schema expands to a regex of about {size:,} characters (limit "
            f"{MAX_REGEX_CHARS:,}); no automaton that size compiles in time. Reduce nesting, "
            "recursion or repeated $refs."
        )
    try:
        text = json.dumps(schema, ensure_ascii=False)
    except OpaqueCall:  # a schema with calls (compiler/front/json_schema/frames.py)
        text = json.dumps(without_calls(schema), ensure_ascii=False)
    nonce = 0
    while f"gclm{nonce}x" in text:
        nonce += 1
    leaves: dict[str, str] = {}
    top = (schema["anyOf"] if "anyOf" in schema else [schema]) if top_level else []
    prepared = _prepare(
        schema, "", f"gclm{nonce}x", leaves, [id(n) for n in top], whitespace=whitespace
    )
    depth = _json_depth(prepared)
    if depth > MAX_JSON_DEPTH:
        raise ConstraintError(
            f"The schema nests {depth} levels of JSON objects and arrays once normalised "
            f"(its $refs expanded); outlines-core reads at most {MAX_JSON_DEPTH}. Flatten it: "
            "fewer nested objects, or a recursive $ref.",
            code="schema_too_deep",
        )
    try:
        regex = build_regex_from_schema(json.dumps(prepared, ensure_ascii=False), whitespace)
    except (ValueError, RuntimeError, TypeError) as e:
        # Its text is outlines-core's, not for the client: logged.
        log.info("outlines-core could not turn a schema into a regex: %r", e)
        raise ConstraintError(
            "outlines-core could not turn the schema into a regex. Simplify the schema."
        ) from e
    # outlines-core's strings lack raw U+007F..U+009F and, unbounded, `\uXXXX`: valid JSON.
    regex = regex.replace(OUTLINES_JSON_CHAR + "*", JSON_CHAR + "*")
    regex = regex.replace(OUTLINES_JSON_CHAR, JSON_CHAR_SHORT)
    return _splice(regex, f"gclm{nonce}x", leaves)


def _splice(regex: str, prefix: str, leaves: dict[str, str]) -> str:
    """`regex` with each quoted placeholder replaced by its leaf, in one pass (a replace per
    leaf rescanned the regex each time: 0.15 s for Github_ultra o65323's 4,460 leaves)."""
    found: set[str] = set()

    def leaf(match: re.Match[str]) -> str:
        found.add(match[1])
        return f"(?:{leaves[match[1]]})"

    regex = re.sub(f'"({re.escape(prefix)}[0-9]+)"', leaf, regex)
    if len(found) != len(leaves):
        missing = next(p for p in leaves if p not in found)
        raise ConstraintError(f"Internal: leaf {missing} vanished from outlines-core's regex.")
    return regex


def regex_size(node: Any, memo: dict[int, int], leaves: bool = False) -> int:
    """Roughly how long outlines-core's regex for a normalised node will be.

    It writes an array's item and a free-key object's value twice, and with no required
    property it repeats property i in n - i alternatives (quadratic in optional properties).
    `leaves`: the strings and numbers gclm writes itself are measured (they are written
    here, once more), not counted as short (a string's `format` or `pattern` can be
    thousands of characters).
    """
    if isinstance(node, FrameCall):
        return 8  # one placeholder character, grouped
    if not isinstance(node, dict):
        return 0
    if id(node) in memo:
        return memo[id(node)]
    size = 60 + len(json.dumps(node.get("enum", "")))
    if leaves and "enum" not in node:
        size += _leaf_size(node)
        if _SPECIAL_OBJECT & node.keys():  # its parts are in its text
            memo[id(node)] = size
            return size
    for key in ("items", "additionalProperties"):
        size += 2 * regex_size(node.get(key), memo, leaves)
    for sub in node.get("anyOf", []) + node.get("prefixItems", []):
        size += regex_size(sub, memo, leaves)
    props = list(node.get("properties", {}).values())
    for i, sub in enumerate(props):
        size += regex_size(sub, memo, leaves) * (1 if node.get("required") else len(props) - i)
    memo[id(node)] = size
    return size


# Objects whose regex gclm writes itself (`_object_regex`).
_SPECIAL_OBJECT = frozenset({"keyPatterns", "extraKeys", "countedChoices"})


def _leaf_size(node: dict[str, Any]) -> int:
    """The length of the regex gclm writes for a string, number or object node (0 for
    others, or where it does not write one)."""
    try:
        if node.get("type") == "object" and _SPECIAL_OBJECT & node.keys():
            return len(_object_regex(node, "", DEFAULT_WHITESPACE))
        if node.get("type") in ("integer", "number"):
            return len(number_regex(node, "") or "")
        if node.get("type") == "string":
            return len(string_regex(node, "") or "")
    except GclmError:  # schema_regex reports it
        return 0
    return 0


def _prepare(
    node: Any, ptr: str, prefix: str, leaves: dict[str, str], top: list[int], whitespace: str
) -> Any:
    """Copy `node` for outlines-core: leaves become placeholders, keys get JSON escapes.

    `top` holds the ids of the nodes that are the whole output (see `string_regex`).
    """
    if isinstance(node, list):
        return [
            _prepare(x, f"{ptr}/{i}", prefix, leaves, top, whitespace) for i, x in enumerate(node)
        ]
    if not isinstance(node, dict):
        return node
    leaf = None
    if isinstance(node, FrameCall):  # a recursive definition's call: one character
        leaf = call_char(node.frame)
    elif "enum" in node:
        if not any(isinstance(v, dict | list) for v in node["enum"]):
            return node
        # outlines-core writes the keys of an object in an enum or const raw into its
        # regex ("a.b" then matches "aXb", "a(b" breaks it): gclm writes such values
        # itself, as compact JSON.
        leaf = "|".join(
            escape_literal(json.dumps(v, ensure_ascii=False, separators=(",", ":")))
            for v in node["enum"]
        )
    elif node.get("type") in ("integer", "number"):
        leaf = number_regex(node, ptr)
    elif node.get("type") == "string":
        leaf = string_regex(node, ptr, top_level=id(node) in top)
    elif node.get("type") == "object" and node.keys() & {
        "keyPatterns",
        "extraKeys",
        "countedChoices",
    }:
        leaf = _object_regex(node, ptr, whitespace)
    if leaf is not None:
        placeholder = f"{prefix}{len(leaves)}"
        leaves[placeholder] = leaf
        return {"const": placeholder}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            # outlines-core regex-escapes a name but does not JSON-escape it.
            out[key] = {
                _json_escaped(k): _prepare(
                    v, f"{ptr}/properties/{escape_pointer(k)}", prefix, leaves, top, whitespace
                )
                for k, v in value.items()
            }
        elif key == "required":
            out[key] = [_json_escaped(k) for k in value]
        else:
            out[key] = _prepare(value, f"{ptr}/{key}", prefix, leaves, top, whitespace)
    return out


def _object_regex(node: dict[str, Any], ptr: str, ws: str) -> str:
    """An object outlines-core cannot write (see `open_objects.py`); values built here."""
    if "countedChoices" in node:
        values = {
            n: schema_regex(sub, ws, top_level=False) for n, sub in node["properties"].items()
        }
        return counted_object_regex(values, node["countedChoices"], ws)
    if "extraKeys" in node:
        entries = [
            (name, schema_regex(sub, ws, top_level=False), name in node["required"])
            for name, sub in node["properties"].items()
        ]
        extra = schema_regex(node["extraKeys"], ws, False)
        anywhere = not node.get("extrasAfter")
        return open_object_regex(entries, extra, ws, anywhere, node.get("absentKeys", []))
    names = [
        '"' + pattern_regex(p, f"{ptr}/patternProperties/{escape_pointer(p)}") + '"'
        for p in node["keyPatterns"]
    ]
    value = schema_regex(node["additionalProperties"], ws, top_level=False)
    return keyed_object_regex(
        names, value, node.get("minProperties", 0), node.get("maxProperties"), ws
    )


def _json_escaped(name: str) -> str:
    return json.dumps(name, ensure_ascii=False)[1:-1]
