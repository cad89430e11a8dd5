"""Proofs about original (unnormalised) subschemas, for `oneOf`, `not` and `propertyNames`.

Normalised nodes generate a subset of what their schema accepts, so they cannot stand in
for a schema that must *reject* a value. These checks read the original subschema
instead. Each is one-sided: True only when proven; anything unproven reads as False (or
None from `holds`), and the caller then keeps less or refuses the schema.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from gclm.compiler.front.json_schema.ops import (
    ASSERTIONS,
    NUMERIC,
    Node,
    canonical,
    json_type,
    keyword_types,
    member,
    number_ok,
    string_ok,
)
from gclm.compiler.front.json_schema.patterns import CHECKED_FORMATS, FORMATS
from gclm.compiler.front.json_schema.prefixes import meets, node_starts, pattern_starts


class Prover:
    """Three-valued checks of original subschemas against values and nodes.

    `resolve(ref)` returns the subschema a `$ref` names. Every answer is True only when
    proven; False or None (for `holds`) means "not proven", never "proven false"
    unless stated.
    """

    def __init__(self, resolve: Callable[[str], Any]):
        self.resolve = resolve
        self.depth = 0

    def holds(self, schema: Any, value: Any) -> bool | None:
        """Whether `value` is valid against `schema`: True, False, or None (unknown)."""
        if schema is True or schema == {}:
            return True
        if schema is False:
            return False
        if not isinstance(schema, dict) or self.depth > 50:
            return None
        self.depth += 1
        try:
            results = [check(schema, value) for check in self._value_checks()]
        finally:
            self.depth -= 1
        if False in results:
            return False
        return None if None in results else True

    def _value_checks(self) -> list[Callable[[dict[str, Any], Any], bool | None]]:
        return [
            self._check_ref,
            self._check_type,
            self._check_enum,
            self._check_logic,
            self._check_rest,
        ]

    def _check_ref(self, s: dict[str, Any], v: Any) -> bool | None:
        return self.holds(self.resolve(s["$ref"]), v) if isinstance(s.get("$ref"), str) else True

    def _check_type(self, s: dict[str, Any], v: Any) -> bool | None:
        if "type" not in s:
            return True
        types = s["type"] if isinstance(s["type"], list) else [s["type"]]
        t = json_type(v)
        return t in types or t == "integer" and "number" in types

    def _check_enum(self, s: dict[str, Any], v: Any) -> bool | None:
        ok = True
        if "const" in s:
            ok = member({"enum": [s["const"]]}, v)
        if ok and isinstance(s.get("enum"), list):
            ok = member({"enum": s["enum"]}, v)
        return ok

    def _check_logic(self, s: dict[str, Any], v: Any) -> bool | None:
        results: list[bool | None] = [self.holds(x, v) for x in s.get("allOf", [])]
        for key in ("anyOf", "oneOf"):
            if key in s:
                sub = [self.holds(x, v) for x in s[key]]
                if None in sub:
                    results.append(None)
                else:
                    results.append(any(sub) if key == "anyOf" else sub.count(True) == 1)
        if "not" in s:
            inner = self.holds(s["not"], v)
            results.append(None if inner is None else not inner)
        if False in results:
            return False
        return None if None in results else True

    def _check_rest(self, s: dict[str, Any], v: Any) -> bool | None:
        handled = {"$ref", "type", "enum", "const", "allOf", "anyOf", "oneOf", "not"}
        t = json_type(v)
        simple = {
            "integer": set(NUMERIC) | {"multipleOf"},
            "number": set(NUMERIC) | {"multipleOf"},
            "string": {"minLength", "maxLength", "pattern"},
            "array": {"minItems", "maxItems", "uniqueItems", "contains"},
            "object": {
                "required",
                "minProperties",
                "maxProperties",
                "patternProperties",
                "propertyNames",
                "dependentRequired",
            },
        }
        rest = (s.keys() & ASSERTIONS) - handled - {"format"}
        relevant = {k for k in rest if _applies(k, t)}
        fmt = s.get("format")
        if t == "string" and fmt in CHECKED_FORMATS:
            # FORMATS are subsets of their formats: a match proves validity, a miss proves nothing.
            if fmt not in FORMATS or not re.fullmatch(FORMATS[fmt], v):
                return None
        if relevant - simple.get(t, set()) - {"properties", "items", "additionalProperties"}:
            return None
        if t in ("integer", "number"):
            if any(isinstance(s[k], bool) for k in relevant):
                return None  # draft-4 boolean exclusive bounds
            return number_ok({k: s[k] for k in relevant}, v)
        if t == "string":
            return string_ok({k: s[k] for k in relevant}, v)
        if t == "array":
            return self._check_array(s, v)
        if t == "object":
            return self._check_object(s, v)
        return True

    def _check_array(self, s: dict[str, Any], v: list[Any]) -> bool | None:
        ok = s.get("minItems", 0) <= len(v) <= s.get("maxItems", len(v))
        if ok and s.get("uniqueItems") is True:
            ok = len({canonical(_plain(x)) for x in v}) == len(v)
        items = s.get("items", True)
        if not ok or isinstance(items, list) or "minContains" in s or "maxContains" in s:
            return None if ok else False
        results = [self.holds(items, x) for x in v]
        if "contains" in s:
            found = [self.holds(s["contains"], x) for x in v]
            results.append(True if True in found else None if None in found else False)
        return _all3(results)

    def _check_object(self, s: dict[str, Any], v: dict[str, Any]) -> bool | None:
        """Each key's value against `properties`, the `patternProperties` its name matches
        (Python's re standing in for ECMA-262, as in string_ok) or else
        `additionalProperties`; names against `propertyNames`; `required` and counts."""
        if any(r not in v for r in s.get("required", [])):
            return False
        if not s.get("minProperties", 0) <= len(v) <= s.get("maxProperties", len(v)):
            return False
        for key, needs in s.get("dependentRequired", {}).items():
            if key in v and isinstance(needs, list) and any(n not in v for n in needs):
                return False
        props, extra = s.get("properties", {}), s.get("additionalProperties", True)
        patterns = s.get("patternProperties", {})
        results: list[bool | None] = []
        for key, value in v.items():
            try:
                matched = [sub for p, sub in patterns.items() if re.search(p, key)]
            except re.error:
                return None
            subs = ([props[key]] if key in props else []) + matched
            results += [self.holds(sub, value) for sub in subs or [extra]]
            if "propertyNames" in s:
                results.append(self.holds(s["propertyNames"], key))
        return _all3(results)

    def rejects(self, schema: Any, node: Node | None) -> bool:
        """True when every value `node` generates is proven invalid against `schema`."""
        if node is None or schema is False:
            return True
        if not isinstance(schema, dict) or self.depth > 50:
            return False
        if "anyOf" in node:
            return all(self.rejects(schema, b) for b in node["anyOf"])
        if "enum" in node:
            return all(self.holds(schema, v) is False for v in node["enum"])
        self.depth += 1
        try:
            return self._rejects_typed(schema, node)
        finally:
            self.depth -= 1

    def _rejects_typed(self, s: dict[str, Any], node: Node) -> bool:
        t = node["type"]
        if isinstance(s.get("$ref"), str) and self.rejects(self.resolve(s["$ref"]), node):
            return True
        if "type" in s:
            types = s["type"] if isinstance(s["type"], list) else [s["type"]]
            # A number node also generates integers.
            covered = (
                {"number", "integer"} if t == "number" else {t, "number"} if t == "integer" else {t}
            )
            if not covered & set(types):
                return True
        values = [s["const"]] if "const" in s else s.get("enum")
        if isinstance(values, list) and not any(member(node, v) for v in values):
            return True  # the schema accepts only values this node never generates
        if any(self.rejects(x, node) for x in s.get("allOf", [])):
            return True
        for key in ("anyOf", "oneOf"):
            if key in s and all(self.rejects(x, node) for x in s[key]):
                return True
        if "not" in s and self.accepts_all(s["not"], node):
            return True
        if t == "string" and isinstance(s.get("pattern"), str):
            # Every string the schema accepts starts with one of `need` (and is not empty);
            # every non-empty one the node writes with one of `have`.
            need, have = pattern_starts(s["pattern"]), node_starts(node)
            if need is not None and have is not None and not meets(need, have):
                return True
        if t == "object":
            props = node["properties"]
            # An open node may write any undeclared key among its extra keys, and a node
            # without declared properties writes free keys: either may hold a required name.
            closed = node["declared"] and not node.get("open")
            if closed and any(r not in props for r in s.get("required", [])):
                return True
            sprops = s.get("properties", {})
            if isinstance(sprops, dict):
                for name in node["required"]:
                    if name in sprops and self.rejects(sprops[name], props[name]):
                        return True
                # A key the node always writes that the schema forbids as undeclared.
                if s.get("additionalProperties") is False and not s.get("patternProperties"):
                    if any(name not in sprops for name in node["required"]):
                        return True
        return False

    def accepts_all(self, schema: Any, node: Node | None) -> bool:
        """True when every value `node` generates is proven valid against `schema`."""
        if node is None or schema is True or schema == {}:
            return True
        if not isinstance(schema, dict):
            return False
        if "anyOf" in node:
            return all(self.accepts_all(schema, b) for b in node["anyOf"])
        if "enum" in node:
            return all(self.holds(schema, v) is True for v in node["enum"])
        if any(self.accepts_all(x, node) for x in schema.get("anyOf", [])):
            return True
        said = schema.keys() & ASSERTIONS - {"type"}
        if said == {"required"} and node["type"] == "object":
            # An object node always writes its required names.
            names = schema["required"]
            if not isinstance(names, list) or any(n not in node["required"] for n in names):
                return False
            said = set()
        if said:
            return False
        if "type" not in schema:
            return True
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        return node["type"] in types or node["type"] == "integer" and "number" in types


def _applies(keyword: str, t: str) -> bool:
    types = keyword_types(keyword)
    return not types or t in types or t == "integer" and "number" in types


def _plain(value: Any) -> Any:
    """`value` with integral floats as ints, so that canonical() keys JSON equality (1.0 is 1)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_plain(x) for x in value]
    if isinstance(value, dict):
        return {k: _plain(x) for k, x in value.items()}
    return value


def _all3(results: Any) -> bool | None:
    out: bool | None = True
    for r in results:
        if r is False:
            return False
        if r is None:
            out = None
    return out
