"""Set operations on normalised schema nodes: union, intersection, membership, rejection.

A node is what `compiler/front/json_schema/normalize.py` builds: `None` (no value),
`{"anyOf": [...]}`, `{"enum": [...]}`, or `{"type": T, ...}` with only the keywords that
type's generator reads. An object node carries `properties`, `required` and `additionalProperties`
(`False` when undeclared keys are not allowed), `keyPatterns` when an undeclared key's
name must match one of those patterns, and `absent`: names that may not be added by a
meet (a dependency's trigger the node does not write, a declared name no value fits); it
generates its declared
properties only, and after them undeclared keys when it is `open`.

`meet` is exact on what nodes generate, so allOf never widens the output. The checks that
involve an original (unnormalised) schema - `holds`, `rejects`, `accepts_all` - answer
True only when they can prove it; `oneOf` and `not` keep just what is proven.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from gclm.compiler.front.deadline import check
from gclm.compiler.front.json_schema.calls import FrameCall, OpaqueCall, without_calls
from gclm.compiler.front.json_schema.patterns import FORMATS
from gclm.errors import ConstraintError, UnsupportedSchemaError

Node = dict[str, Any]
MAX_BRANCHES = 256  # an allOf of anyOfs multiplies branches; past this we refuse
NUMERIC = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


_KEYWORD_TYPES = {
    "string": {"minLength", "maxLength", "pattern", "format"},
    "array": {
        "items",
        "prefixItems",
        "additionalItems",
        "minItems",
        "maxItems",
        "uniqueItems",
        "contains",
        "unevaluatedItems",
    },
    "object": {
        "properties",
        "required",
        "additionalProperties",
        "patternProperties",
        "minProperties",
        "maxProperties",
        "propertyNames",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "unevaluatedProperties",
    },
    "number": set(NUMERIC) | {"multipleOf"},
}

# Keywords whose presence makes a subschema say something about a value.
ASSERTIONS = {
    "type",
    "enum",
    "const",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "$ref",
    "if",
    "$dynamicRef",
    "$recursiveRef",
}.union(*_KEYWORD_TYPES.values())


def keyword_types(keyword: str) -> set[str]:
    """JSON types a type-specific keyword constrains (empty for keywords of every type)."""
    return {t for t, keys in _KEYWORD_TYPES.items() if keyword in keys}


def canonical(value: Any) -> str:
    check()  # called throughout the meets and unions: a server thread's deadline
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except OpaqueCall:  # a node holding a recursive definition's call: one text for it
        return json.dumps(
            without_calls(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )


def json_type(value: Any) -> str:
    """The JSON Schema type of a JSON value ("integer" for integral numbers)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or isinstance(value, float) and value.is_integer():
        return "integer"
    if isinstance(value, float):
        return "number"
    names: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return names[type(value)]


def branches(node: Node | None) -> list[Node]:
    if node is None:
        return []
    if isinstance(node, FrameCall):  # a recursive definition's call is one branch
        return [node]
    return node["anyOf"] if "anyOf" in node else [node]


def union(nodes: Sequence[Node | None]) -> Node | None:
    """anyOf of `nodes`, flattened, without empty or repeated branches."""
    seen: dict[str, Node] = {}
    values: dict[str, Any] = {}  # every enum branch folds into one
    for node in nodes:
        for branch in branches(node):
            if not isinstance(branch, FrameCall) and "enum" in branch:
                values.update((canonical(v), v) for v in branch["enum"])
            else:
                seen.setdefault(canonical(branch), branch)
    out = ([{"enum": list(values.values())}] if values else []) + list(seen.values())
    if not out:
        return None
    return out[0] if len(out) == 1 else {"anyOf": out}


def meet(a: Node | None, b: Node | None, pointer: str) -> Node | None:
    """Intersection of two nodes: the values both generate.

    Raises:
        UnsupportedSchemaError: two different patterns, formats or multipleOfs on one
            value, or an allOf of anyOfs with more than MAX_BRANCHES combinations.
    """
    if a is None or b is None:
        return None
    # any_node stands for `true` (any value), cut at a depth only to bound what it
    # generates itself: met with a schema it is that schema, however deep the schema goes.
    if is_any(a):
        return b
    if is_any(b):
        return a
    if "anyOf" in a or "anyOf" in b:
        pairs = [(x, y) for x in branches(a) for y in branches(b)]
        if len(pairs) > MAX_BRANCHES:
            raise UnsupportedSchemaError(
                "allOf", pointer, f"{len(pairs)} anyOf combinations to intersect"
            )
        return union([meet(x, y, pointer) for x, y in pairs])
    if "enum" in b:
        a, b = b, a
    if "enum" in a:
        kept = [v for v in a["enum"] if member(b, v)]
        return {"enum": kept} if kept else None
    ta, tb = a["type"], b["type"]
    if ta != tb:
        if {ta, tb} != {"integer", "number"}:
            return None
        ta = "integer"
    if ta in ("integer", "number"):
        return _meet_numbers(a, b, ta, pointer)
    if ta == "string":
        return _meet_strings(a, b, pointer)
    if ta == "array":
        return _meet_arrays(a, b, pointer)
    if ta == "object":
        return _meet_objects(a, b, pointer)
    return a  # null, boolean


def _meet_numbers(a: Node, b: Node, t: str, pointer: str) -> Node:
    out: Node = {"type": t}
    for key, pick in zip(NUMERIC, (max, min, max, min), strict=True):
        values = [n[key] for n in (a, b) if key in n]
        if values:
            out[key] = pick(values)
    steps = {Decimal(str(n["multipleOf"])) for n in (a, b) if "multipleOf" in n}
    if steps:
        big = max(steps)
        if any(big % s for s in steps):
            raise UnsupportedSchemaError(
                "multipleOf", pointer, "two multipleOf values that do not divide each other"
            )
        out["multipleOf"] = next(
            n["multipleOf"] for n in (a, b) if Decimal(str(n.get("multipleOf", 0))) == big
        )
    return out


def _meet_strings(a: Node, b: Node, pointer: str) -> Node | None:
    out: Node = {"type": "string"}
    for key in ("pattern", "format"):
        values = {n[key] for n in (a, b) if key in n}
        if len(values) > 1:
            raise UnsupportedSchemaError(key, pointer, f"two different {key}s apply to one string")
        if values:
            out[key] = values.pop()
    out["minLength"] = max(a.get("minLength", 0), b.get("minLength", 0))
    highs = [n["maxLength"] for n in (a, b) if "maxLength" in n]
    if highs:
        out["maxLength"] = min(highs)
        if out["maxLength"] < out["minLength"]:
            return None
    if not out["minLength"]:
        del out["minLength"]
    return out


def _meet_arrays(a: Node, b: Node, pointer: str) -> Node | None:
    if "prefixItems" in b:
        a, b = b, a
    if "prefixItems" in a:
        items = a["prefixItems"]
        if "prefixItems" in b:
            if len(b["prefixItems"]) != len(items):
                return None
            others = b["prefixItems"]
        elif b.get("minItems", 0) <= len(items) <= b.get("maxItems", len(items)):
            others = [b.get("items")] * len(items)
        else:
            return None
        met = [
            meet(x, y, pointer) if y is not None else x for x, y in zip(items, others, strict=True)
        ]
        return None if any(m is None for m in met) else {"type": "array", "prefixItems": met}
    return array_node(
        meet(a["items"], b["items"], pointer) if "items" in a and "items" in b else None,
        max(a.get("minItems", 0), b.get("minItems", 0)),
        min([n["maxItems"] for n in (a, b) if "maxItems" in n], default=None),
    )


def array_node(items: Node | None, min_items: int, max_items: int | None) -> Node | None:
    """A list-mode array node; `items=None` means no item is allowed."""
    if items is None:
        max_items = 0
    if max_items is not None and min_items > max_items:
        return None
    out: Node = {"type": "array"}
    if max_items != 0:
        out["items"] = items
    if min_items:
        out["minItems"] = min_items
    if max_items is not None:
        out["maxItems"] = max_items
    return out


def _meet_objects(a: Node, b: Node, pointer: str) -> Node | None:
    props: dict[str, Node] = {}
    dropped: list[str] = []
    required = list(dict.fromkeys(a["required"] + b["required"]))
    for name in dict.fromkeys(list(a["properties"]) + list(b["properties"])):
        x = a["properties"].get(name, undeclared(a, name))
        y = b["properties"].get(name, undeclared(b, name))
        node = meet(x, y, f"{pointer}/properties/{escape_pointer(name)}")
        if node is not None:
            props[name] = node
        elif name in required:
            return None
        else:
            dropped.append(name)  # a name no value fits: no extra key may be it
    extra_a, extra_b = a["additionalProperties"], b["additionalProperties"]
    extra = meet(extra_a, extra_b, pointer) if extra_a and extra_b else None
    keys_a, keys_b = a.get("keyPatterns"), b.get("keyPatterns")
    if keys_a and keys_b and keys_a != keys_b:
        extra = None  # names matching both lists: not one regex; no undeclared keys
    out: Node = {
        "type": "object",
        "properties": props,
        "required": required,
        "declared": a["declared"] or b["declared"],
        "additionalProperties": False if extra is None else extra,
    }
    if extra is not None and (keys_a or keys_b):
        out["keyPatterns"] = keys_a or keys_b
    absent = sorted({*a.get("absent", ()), *b.get("absent", ()), *dropped} - set(props))
    if absent:
        out["absent"] = absent
    if extra is not None and a.get("open") and b.get("open"):  # `dropped` names: absent
        out["open"] = True
    for key, pick in (("minProperties", max), ("maxProperties", min)):
        values = [n[key] for n in (a, b) if key in n]
        if values:
            out[key] = pick(values)
    return out


def undeclared(node: Node, name: str) -> Node | None:
    """What an object node allows under an undeclared key `name` (None: the key is not)."""
    if name in node.get("absent", ()):
        return None  # a dependency's trigger the node never writes (objects.py)
    patterns = node.get("keyPatterns")
    if patterns and not any(_searches(p, name) for p in patterns):
        return None
    return node["additionalProperties"] or None


def _searches(pattern: str, name: str) -> bool:
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return False


def escape_pointer(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


# ------------------------------------------------------------------ membership of values


def member(node: Node | None, value: Any) -> bool:
    """Whether `node` accepts the JSON value `value` (exact on nodes)."""
    if node is None:
        return False
    if "anyOf" in node:
        return any(member(b, value) for b in node["anyOf"])
    if "enum" in node:
        key = canonical(value)
        return any(canonical(v) == key or _same_number(v, value) for v in node["enum"])
    t, actual = node["type"], json_type(value)
    if t != actual and not (t == "number" and actual == "integer"):
        return False
    if t in ("integer", "number"):
        return number_ok(node, value)
    if t == "string":
        return string_ok(node, value)
    if t == "array":
        if "prefixItems" in node:
            return len(value) == len(node["prefixItems"]) and all(
                member(n, v) for n, v in zip(node["prefixItems"], value, strict=True)
            )
        return node.get("minItems", 0) <= len(value) <= node.get("maxItems", len(value)) and all(
            member(node.get("items"), v) for v in value
        )
    if t == "object":
        return (
            all(r in value for r in node["required"])
            and node.get("minProperties", 0) <= len(value) <= node.get("maxProperties", len(value))
            and all(
                member(node["properties"].get(k, undeclared(node, k)), v) for k, v in value.items()
            )
        )
    return True


def _same_number(a: Any, b: Any) -> bool:
    numeric = json_type(a) in ("integer", "number") and json_type(b) in ("integer", "number")
    return numeric and a == b


def number_ok(node: Node, value: Any) -> bool:
    try:
        x = Decimal(str(value))
    except InvalidOperation:
        return False
    checks: list[tuple[str, Callable[[Decimal, Decimal], bool]]] = [
        ("minimum", lambda x, b: x >= b),
        ("maximum", lambda x, b: x <= b),
        ("exclusiveMinimum", lambda x, b: x > b),
        ("exclusiveMaximum", lambda x, b: x < b),
        ("multipleOf", lambda x, b: x % b == 0),
    ]
    return all(check(x, Decimal(str(node[key]))) for key, check in checks if key in node)


def string_ok(node: Node, value: str) -> bool:
    if not node.get("minLength", 0) <= len(value) <= node.get("maxLength", len(value)):
        return False
    if "format" in node and not re.fullmatch(FORMATS[node["format"]], value):
        return False
    try:
        # Python's re stands in for ECMA-262 here; both agree on the patterns gclm accepts.
        return "pattern" not in node or re.search(node["pattern"], value) is not None
    except re.error:
        return False


# any_node's results, one per depth: is_any knows them by identity. A schema that spells
# the same union (`"type": ["null", "boolean", "number", "string"]`) is a real constraint.
_ANY: dict[int, Node] = {}


def any_node(depth: int) -> Node:
    """Any JSON value with at most `depth` levels of arrays and objects (shared: do not edit)."""
    depth = max(depth, 0)
    if depth not in _ANY:
        scalars: list[Node] = [{"type": t} for t in ("null", "boolean", "number", "string")]
        if depth == 0:
            _ANY[0] = {"anyOf": scalars}
        else:
            inner = any_node(depth - 1)
            _ANY[depth] = {
                "anyOf": scalars
                + [
                    {"type": "array", "items": inner},
                    {
                        "type": "object",
                        "properties": {},
                        "required": [],
                        "additionalProperties": inner,
                        "declared": False,
                    },
                ]
            }
    return _ANY[depth]


def is_any(node: Node) -> bool:
    """Whether `node` is an any_node (of some depth): a stand-in for `true`."""
    return any(node is n for n in _ANY.values())


# ------------------------------------------------------------ keyword value checks


def dedupe(values: list[Any]) -> list[Any]:
    return list({canonical(v): v for v in values}.values())


def array_of(s: dict[str, Any], key: str, ptr: str) -> list[Any]:
    value = s.get(key, [])
    if not isinstance(value, list):
        raise ConstraintError(f"'{key}' at {ptr or '/'} must be an array.")
    return value


def object_of(s: dict[str, Any], key: str, ptr: str) -> dict[str, Any]:
    value = s.get(key, {})
    if not isinstance(value, dict):
        raise ConstraintError(f"'{key}' at {ptr or '/'} must be an object.")
    return value


def count_of(s: dict[str, Any], key: str, ptr: str) -> int:
    value = s[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConstraintError(f"'{key}' at {ptr or '/'} must be a non-negative integer.")
    return value


def number_of(s: dict[str, Any], key: str, ptr: str) -> int | float:
    value = s[key]
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ConstraintError(f"'{key}' at {ptr or '/'} must be a number.")
    if key == "multipleOf" and value <= 0:
        raise ConstraintError(f"'multipleOf' at {ptr or '/'} must be greater than 0.")
    return value
