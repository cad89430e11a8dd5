"""The object keywords of a subschema, turned into one object node.

Kept: properties, required, additionalProperties, patternProperties, min/maxProperties,
propertyNames (checked against each declared name), dependentRequired (dependents of an
optional property become required) and dependentSchemas (an optional trigger splits the
object: without it, or with it and the dependent schema). Objects narrowed to fail a
`not` or the other branches of a oneOf are in exclusions.py.
"""

from __future__ import annotations

import re
from functools import reduce
from typing import Any, Protocol

from gclm.compiler.front.json_schema.ops import (
    ASSERTIONS,
    Node,
    any_node,
    array_of,
    branches,
    count_of,
    escape_pointer,
    meet,
    object_of,
    union,
)
from gclm.compiler.front.json_schema.patterns import FORMATS
from gclm.compiler.front.json_schema.proofs import Prover
from gclm.compiler.front.rust_regex import parse_problem
from gclm.errors import UnsupportedSchemaError, quote

# dependentSchemas of optional triggers: each present or absent, 2**N objects at most.
MAX_OPTIONAL_TRIGGERS = 4

# The rewrite noted where a free-form object's values nest deeper than a `{}` value's.
FREE_FORM_NOTE = "free-form object: values nested at most"


class Subschemas(Protocol):
    """What object_node needs from the normaliser (normalize.Normalizer implements it)."""

    any_depth: int
    free_object_depth: int
    open_objects: bool  # additionalProperties unsaid: other keys may follow the declared
    prover: Prover

    def schema(self, s: Any, ptr: str, within: Node | None = None) -> Node | None:
        """The node of subschema `s` at pointer `ptr` (met with `within`, if given)."""
        ...

    def note(self, pointer: str, text: str) -> None:
        """Record a rewrite the user is told about."""
        ...


def object_node(self: Subschemas, s: dict[str, Any], ptr: str) -> Node | None:
    """The node for `s` as an object: declared properties, or free keys.

    Required names that are not declared get their schema from patternProperties or
    additionalProperties. What undeclared keys may hold is kept so that allOf can
    intersect objects, but only declared properties are ever generated.
    """
    props_s = object_of(s, "properties", ptr)
    patterns = object_of(s, "patternProperties", ptr)
    required = list(dict.fromkeys(array_of(s, "required", ptr)))
    extra_s = s.get("additionalProperties", s.get("unevaluatedProperties", True))
    names_s = s.get("propertyNames", True)
    deps = object_of(s, "dependencies", ptr)
    dep_required = {
        **{k: v for k, v in deps.items() if isinstance(v, list)},
        **object_of(s, "dependentRequired", ptr),
    }
    dep_schemas = {
        **{k: v for k, v in deps.items() if not isinstance(v, list)},
        **object_of(s, "dependentSchemas", ptr),
    }
    for pattern in patterns:
        try:
            re.compile(pattern)
        except (re.error, OverflowError, RecursionError) as e:
            raise UnsupportedSchemaError(
                "patternProperties", ptr, f"{quote(pattern)} does not parse: {parse_problem(e)}"
            ) from e

    def matching(name: str) -> list[Node | None]:
        return [
            self.schema(sub, f"{ptr}/patternProperties/{escape_pointer(p)}")
            for p, sub in patterns.items()
            if re.search(p, name)
        ]

    # A required trigger's dependents are required too (to a fixpoint: they may be triggers),
    # declared or not: an undeclared one is generated like any undeclared required name.
    grown = True
    while grown:
        grown = False
        for trigger, needs in dep_required.items():
            if trigger in required and any(n not in required for n in needs):
                required += [n for n in needs if n not in required]
                grown = True
    declared = list(props_s) + [r for r in required if r not in props_s]
    if not declared and (dep_required or dep_schemas):
        key = "dependentRequired" if dep_required else "dependentSchemas"
        raise UnsupportedSchemaError(
            key, ptr, "keys of an object without declared properties are free"
        )
    # What an undeclared key may hold: additionalProperties and every pattern it might match.
    # A free-form object's values nest deeper than a `{}` value (see SchemaLimits).
    types = s.get("type")
    free = not declared and (types == "object" or isinstance(types, list) and "object" in types)
    extra = (
        any_node(self.free_object_depth if free else self.any_depth)
        if extra_s is True
        else self.schema(extra_s, f"{ptr}/additionalProperties")
    )
    if free and extra_s is True and self.free_object_depth > self.any_depth:
        self.note(ptr, f"{FREE_FORM_NOTE} {self.free_object_depth} deep")
    pattern_nodes = [
        self.schema(sub, f"{ptr}/patternProperties/{escape_pointer(p)}")
        for p, sub in patterns.items()
    ]
    # With additionalProperties false, the undeclared keys are those a pattern matches:
    # generated with a name that matches one, and a value that meets every pattern's schema.
    key_patterns = list(patterns) if extra is None and patterns else []
    if key_patterns:
        extra = reduce(lambda a, b: meet(a, b, ptr), pattern_nodes)
    else:
        extra = reduce(lambda a, b: meet(a, b, ptr), pattern_nodes, extra)
    if names_s not in (True, {}) and not declared:
        # Free keys: each name matches propertyNames, written as one key pattern.
        name_pattern = _name_pattern(names_s)
        if name_pattern is None or key_patterns:
            raise UnsupportedSchemaError(
                "propertyNames",
                ptr,
                "keys of an object without declared properties are generated only for a "
                "propertyNames that is one pattern, format or enum of names"
                + (" (and not with additionalProperties false)" if key_patterns else ""),
            )
        key_patterns = [name_pattern]
    elif names_s not in (True, {}):
        extra = None  # undeclared keys could not be checked against propertyNames
    props: dict[str, Node] = {}
    for name in declared:
        p_ptr = f"{ptr}/properties/{escape_pointer(name)}"
        if name in props_s:
            parts = [self.schema(props_s[name], p_ptr), *matching(name)]
        else:
            parts = matching(name) or [
                any_node(self.any_depth)
                if extra_s is True
                else self.schema(extra_s, f"{ptr}/additionalProperties")
            ]
        node = reduce(lambda a, b: meet(a, b, p_ptr), parts)
        ok = self.prover.holds(names_s, name)
        if ok is None:
            raise UnsupportedSchemaError(
                "propertyNames", ptr, f"cannot check the name {quote(name)} against it"
            )
        if node is not None and ok:
            props[name] = node
        elif name in required:
            return None
    for trigger, needs in dep_required.items():
        if trigger in props and any(n not in required for n in needs):
            if any(n not in props for n in needs):
                raise UnsupportedSchemaError(
                    "dependentRequired", ptr, f"{quote(trigger)} needs undeclared properties"
                )
            if trigger not in required:
                self.note(
                    f"{ptr}/dependentRequired/{escape_pointer(trigger)}",
                    f"{needs} made required (they depend on {quote(trigger)})",
                )
            required += [n for n in needs if n not in required]
    out: Any = {  # a Node, until meet() below may make it None
        "type": "object",
        "properties": props,
        "required": [r for r in required if r in props],
        "additionalProperties": False if extra is None else extra,
        # Declared properties (even if none survive) mean "generate these"; without any,
        # keys are generated freely from additionalProperties.
        "declared": bool(props_s or required),
    }
    if key_patterns and extra is not None:
        out["keyPatterns"] = key_patterns
    # A trigger that is not generated must not come back through an allOf sibling that
    # declares it (the dependency would then go unchecked), nor a declared name no value
    # fits (`"a": false`, or a name propertyNames rejects).
    absent = sorted(n for n in {*dep_required, *dep_schemas, *declared} if n not in props)
    if absent:
        out["absent"] = absent
    # An explicit `additionalProperties` (true or a schema) beside declared properties, or
    # none said under `open_objects` (the request's additional_properties "spec"): keys
    # other than the declared ones may go among them. Not with patterns, propertyNames,
    # property counts or dependencies (an extra key could be a trigger), which one regex of
    # extra keys cannot honour. A declared name never generated (`"a": false`) is `absent`:
    # no extra key may be it either.
    if (
        ("additionalProperties" in s or self.open_objects)
        and extra is not None
        and props
        and not patterns
        and names_s in (True, {})
        and not s.keys() & {"minProperties", "maxProperties"}
        and not (dep_required or dep_schemas)
    ):
        out["open"] = True
    for key in ("minProperties", "maxProperties"):
        if key in s:
            out[key] = count_of(s, key, ptr)
    optional = [t for t in dep_schemas if t in props and t not in required]
    if len(optional) > MAX_OPTIONAL_TRIGGERS:
        raise UnsupportedSchemaError(
            "dependentSchemas",
            ptr,
            f"{len(optional)} optional triggers {optional} (gclm writes each present or absent, "
            f"at most {MAX_OPTIONAL_TRIGGERS}); make some of them required",
        )
    for trigger, sub in dep_schemas.items():
        if trigger in props:
            out = _dependent(
                self, out, trigger, sub, f"{ptr}/dependentSchemas/{escape_pointer(trigger)}"
            )
    return out


def _dependent(
    self: Subschemas, node: Node | None, trigger: str, sub: Any, ptr: str
) -> Node | None:
    """`node` where `sub` applies when `trigger` is present.

    A required trigger meets `sub` (its oneOf and not see the object). An optional one
    splits the object in two: without the trigger (which no allOf sibling may add back), or
    with it required and `sub` met.
    """
    out: list[Node | None] = []
    for branch in branches(node):
        if "enum" in branch:  # objects listed by value: keep those proven to meet `sub`
            values = [
                v
                for v in branch["enum"]
                if not isinstance(v, dict) or trigger not in v or self.prover.holds(sub, v)
            ]
            out.append({"enum": values} if values else None)
        elif trigger in branch["required"]:
            out.append(self.schema(sub, ptr, within=branch))
        elif trigger not in branch["properties"]:
            out.append(branch)
        else:
            props = {k: v for k, v in branch["properties"].items() if k != trigger}
            absent = sorted({*branch.get("absent", ()), trigger})
            out.append({**branch, "properties": props, "absent": absent})
            present = {**branch, "required": [*branch["required"], trigger]}
            out.append(self.schema(sub, ptr, within=present))
    return union(out)


def _name_pattern(names: Any) -> str | None:
    """One pattern that exactly the names `names` (a propertyNames schema) accepts, or None.

    Kept: `pattern`, a `format` gclm writes (its subset), `enum`/`const` of strings, beside
    `type: string` and annotations; anything else is None.
    """
    if not isinstance(names, dict) or names.get("type", "string") != "string":
        return None
    said = names.keys() & ASSERTIONS - {"type"}
    if said == {"pattern"} and isinstance(names["pattern"], str):
        return names["pattern"]
    if said == {"format"} and names["format"] in FORMATS:
        return f"^(?:{FORMATS[names['format']]})$"
    values = (
        [names["const"]] if said == {"const"} else names.get("enum") if said == {"enum"} else None
    )
    if isinstance(values, list) and values and all(isinstance(v, str) for v in values):
        return "^(?:" + "|".join(re.escape(v) for v in values) + ")$"
    return None
