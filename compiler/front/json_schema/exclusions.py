"""Object nodes narrowed until they provably fail a schema: for `oneOf` and `not`.

A branch that cannot be proven to fail the others (or the `not` subschema) as it stands
can often be made to: an optional property left out (a name the other schema requires),
made required (a discriminator whose value the other schema rejects), or its `enum` cut.
Each is a narrowing the caller reports (see `narrowing`).
"""

from __future__ import annotations

from typing import Any

from gclm.compiler.front.json_schema.objects import Subschemas
from gclm.compiler.front.json_schema.ops import Node, union
from gclm.compiler.front.json_schema.proofs import Prover

# `not` of required names: objects without each optional one, at most this many branches.
MAX_NOT_DROPS = 4


def without_optional(self: Subschemas, sub: Any, branch: Node, ptr: str) -> Node | None:
    """`branch` less an optional property, where that proves it fails `sub`, else None.

    Each optional property whose absence proves it gives one branch of the result:
    `not: {required: [a, b]}` (never both) generates objects without `a` or without `b`.
    """
    if branch.get("type") != "object":
        return None
    kept: list[Node] = []
    dropped: list[str] = []
    for name in branch["properties"]:
        if name in branch["required"] or len(kept) == MAX_NOT_DROPS:
            continue
        props = {k: v for k, v in branch["properties"].items() if k != name}
        narrowed = {**branch, "properties": props, "additionalProperties": False}
        narrowed.pop("open", None)  # an extra key could be the one left out
        if self.prover.rejects(sub, narrowed):
            kept.append(narrowed)
            dropped.append(name)
    if kept:
        self.note(
            f"{ptr}/not",
            f"objects generated without one of the optional properties {dropped}, so that "
            "they fail the 'not' subschema",
        )
    return union(kept)


def exclusive_object(self: Subschemas, others: list[Any], branch: Node) -> Node | None:
    """`branch` narrowed until it provably fails every one of `others`, else None.

    For each other schema not yet proven to fail (each of its anyOf/oneOf branches, if it
    has them): an optional property whose value that schema rejects is made required
    (`{kind: {const: a}}` against `{kind: {const: b}}`); else the first optional name it
    requires is left out (oneOf [{required: [a]}, {required: [b]}]: the first branch is
    generated without `b`).
    """
    if branch.get("type") != "object" or not branch["declared"]:
        return None
    narrowed: Node = {**branch, "additionalProperties": False}
    narrowed.pop("open", None)  # an extra key could be the one left out
    for other in others:
        for target in [*_alternatives(self.prover, other), other]:
            if not self.prover.rejects(target, narrowed):
                narrowed = _narrowed_against(self, target, narrowed)
        if not self.prover.rejects(other, narrowed):
            return None
    return narrowed


def narrowing(before: Node, after: Node) -> str:
    """What `exclusive_object` changed, for the rewrite report."""
    dropped = [k for k in before["properties"] if k not in after["properties"]]
    promoted = [k for k in after["required"] if k not in before["required"]]
    how = [f"without the optional properties {dropped}"] if dropped else []
    how += [f"with {promoted} required"] if promoted else []
    return "objects generated " + " and ".join(how)


def _narrowed_against(self: Subschemas, target: Any, narrowed: Node) -> Node:
    """`narrowed` with one optional property made required or left out to fail `target`."""
    props, required = narrowed["properties"], narrowed["required"]
    checks = _properties(self.prover, target)
    rejecting = [
        n
        for n, node in props.items()
        if n not in required and n in checks and self.prover.rejects(checks[n], node)
    ]
    if rejecting:
        return {**narrowed, "required": [*required, rejecting[0]]}
    droppable = [
        n for n in _required_names(self.prover, target) if n in props and n not in required
    ]
    if droppable:
        props = {k: v for k, v in props.items() if k != droppable[0]}
        return {**narrowed, "properties": props}
    return narrowed


def _alternatives(prover: Prover, schema: Any) -> list[Any]:
    """The anyOf/oneOf branches of `schema` (behind a `$ref`); failing all fails it."""
    if isinstance(schema, dict) and isinstance(schema.get("$ref"), str):
        schema = prover.resolve(schema["$ref"])
    if not isinstance(schema, dict):
        return []
    return [
        x for key in ("anyOf", "oneOf") if isinstance(schema.get(key), list) for x in schema[key]
    ]


def _properties(prover: Prover, schema: Any) -> dict[str, Any]:
    """`schema`'s `properties` (behind a `$ref`, if that is all it says)."""
    if isinstance(schema, dict) and isinstance(schema.get("$ref"), str):
        schema = prover.resolve(schema["$ref"])
    props = schema.get("properties") if isinstance(schema, dict) else None
    return props if isinstance(props, dict) else {}


def _required_names(prover: Prover, schema: Any, depth: int = 0) -> list[str]:
    """The names `schema` requires: its own `required`, its `$ref`'s and its allOf members'."""
    if not isinstance(schema, dict) or depth > 20:
        return []
    names = [n for n in schema.get("required", []) if isinstance(n, str)]
    if isinstance(schema.get("$ref"), str):
        names += _required_names(prover, prover.resolve(schema["$ref"]), depth + 1)
    for member in schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []:
        names += _required_names(prover, member, depth + 1)
    return list(dict.fromkeys(names))


def discriminated(self: Subschemas, sub: Any, branch: Node) -> Node | None:
    """`branch` with a property's values cut to those `sub` rejects there, else None.

    `not: {properties: {kind: {const: "a"}}}` (or an `if` on it, for the `else` side) with
    `kind` one of `["a", "b"]`: the objects with `"kind": "b"` fail `sub`. An optional
    `kind` is made required: an object without it meets `sub`'s `properties`.
    """
    if branch.get("type") != "object" or not isinstance(sub, dict):
        return None
    checks = sub.get("properties")
    if not isinstance(checks, dict):
        return None
    for name, check in checks.items():
        prop = branch["properties"].get(name)
        if not prop:
            continue
        if set(prop) == {"enum"}:
            values = [v for v in prop["enum"] if self.prover.holds(check, v) is False]
            cut: Node | None = {"enum": values} if values else None
        else:
            cut = prop if self.prover.rejects(check, prop) else None
        if cut is not None:
            required = list(dict.fromkeys([*branch["required"], name]))
            props = {**branch["properties"], name: cut}
            return {**branch, "properties": props, "required": required}
    return None
