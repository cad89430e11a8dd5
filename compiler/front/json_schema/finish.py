"""Turn normalised nodes into the plain JSON Schema outlines-core receives.

Internal object nodes carry `additionalProperties` so that `allOf` can intersect them;
outlines-core reads only one keyword per subschema, so each object leaves here in exactly
one of its two forms: declared properties (`properties` + `required`, nothing else
generated but, for an open object, `extraKeys` among them) or free keys
(`additionalProperties` + `minProperties`/`maxProperties`).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import combinations
from math import comb

from gclm.compiler.front.json_schema.calls import FrameCall
from gclm.compiler.front.json_schema.ops import Node, escape_pointer
from gclm.errors import UnsupportedSchemaError

# minProperties/maxProperties over optional properties: each allowed choice of the optional
# ones is written out (its values copied), up to this many choices; past it, the first
# optional ones are made required or kept (a narrowing, reported).
MAX_COUNTED_CHOICES = 8
# Other keys anywhere among an open object's declared properties cost a copy of the other
# keys' automaton at each place (about 180 DFA states each, with `spec`'s any-JSON values;
# a flat object of 16 optional properties compiles its DFA in 0.4 s, of 32 in 1.2 s, of
# 64 in 4 s). Past this many declared properties they go after the declared ones only.
MAX_EXTRAS_ANYWHERE = 16


class Finisher:
    """Turn internal nodes into the plain JSON Schema outlines-core receives."""

    def __init__(self, note: Callable[[str, str], None]):
        self.note = note

    def finish(self, node: Node, ptr: str) -> Node:
        if isinstance(node, FrameCall):  # a recursive definition's call, passed along
            return node
        if "anyOf" in node:
            return {
                "anyOf": [self.finish(b, f"{ptr}/anyOf/{i}") for i, b in enumerate(node["anyOf"])]
            }
        if node.get("type") == "array":
            out = dict(node)
            if "prefixItems" in node:
                out["prefixItems"] = [
                    self.finish(n, f"{ptr}/prefixItems/{i}")
                    for i, n in enumerate(node["prefixItems"])
                ]
            elif "items" in node:
                out["items"] = self.finish(node["items"], f"{ptr}/items")
            return out
        if node.get("type") == "object":
            return self.object(node, ptr)
        return node

    def object(self, node: Node, ptr: str) -> Node:
        props, required = node["properties"], list(node["required"])
        extra = node["additionalProperties"]
        min_p, max_p = node.get("minProperties", 0), node.get("maxProperties")
        if not node["declared"]:
            # No declared property: keys are generated freely from additionalProperties.
            if (extra is False or max_p == 0) and min_p > 0:
                raise UnsupportedSchemaError("minProperties", ptr, "no property can be generated")
            if extra is False or max_p == 0:
                return {"type": "object", "properties": {}}
            out: Node = {
                "type": "object",
                "additionalProperties": self.finish(extra, f"{ptr}/additionalProperties"),
            }
            out.update(
                {k: node[k] for k in ("minProperties", "maxProperties", "keyPatterns") if k in node}
            )
            return out
        optional = [p for p in props if p not in required]
        counted = self.counted(props, required, min_p, max_p, ptr)
        if counted is not None:
            return counted
        if len(required) < min_p:
            promoted = optional[: min_p - len(required)]
            if len(required) + len(promoted) < min_p:
                raise UnsupportedSchemaError(
                    "minProperties", ptr, "more properties than are declared"
                )
            self.note(ptr, f"minProperties {min_p}: {promoted} made required")
            required += promoted
        if max_p is not None and len(props) > max_p:
            if len(required) > max_p:
                raise UnsupportedSchemaError(
                    "maxProperties", ptr, "fewer properties than are required"
                )
            keep = set(required) | set(
                [p for p in props if p not in required][: max_p - len(required)]
            )
            self.note(ptr, f"maxProperties {max_p}: only {sorted(keep)} generated")
            props = {k: v for k, v in props.items() if k in keep}
        out = {
            "type": "object",
            "properties": {
                k: self.finish(v, f"{ptr}/properties/{escape_pointer(k)}") for k, v in props.items()
            },
            "required": [r for r in props if r in required],
        }
        if node.get("open") and props == node["properties"] and extra:
            # Undeclared keys among the declared ones (see `open_objects.py`).
            out["extraKeys"] = self.finish(extra, f"{ptr}/additionalProperties")
            if node.get("absent"):  # names no extra key may take either
                out["absentKeys"] = list(node["absent"])
            if len(props) > MAX_EXTRAS_ANYWHERE:
                out["extrasAfter"] = True
                self.note(
                    ptr,
                    f"other keys only after the {len(props)} declared properties "
                    f"(anywhere among at most {MAX_EXTRAS_ANYWHERE})",
                )
        return out

    def counted(
        self, props: dict[str, Node], required: list[str], min_p: int, max_p: int | None, ptr: str
    ) -> Node | None:
        """The object as every choice of optional properties its property count allows.

        None when the count bounds leave the choice free (outlines-core writes that) or
        there are more than MAX_COUNTED_CHOICES choices. The node carries `countedChoices`:
        per choice, the names present, in declared order (see `open_objects.py`).
        """
        optional = [p for p in props if p not in required]
        need = max(min_p - len(required), 0)
        most = len(optional) if max_p is None else min(max_p - len(required), len(optional))
        if (need == 0 and most == len(optional)) or most < need:
            return None  # free choice; or impossible, refused by the caller's narrowing
        if sum(comb(len(optional), k) for k in range(need, most + 1)) > MAX_COUNTED_CHOICES:
            return None
        choices = [
            [p for p in props if p in required or p in chosen]
            for k in range(need, most + 1)
            for chosen in combinations(optional, k)
        ]
        return {
            "type": "object",
            "properties": {
                k: self.finish(v, f"{ptr}/properties/{escape_pointer(k)}") for k, v in props.items()
            },
            "required": [r for r in props if r in required],
            "countedChoices": choices,
        }
