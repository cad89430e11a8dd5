"""Turn normalised nodes into the plain JSON Schema outlines-core receives.

Internal object nodes carry `additionalProperties` so that `allOf` can intersect them;
outlines-core reads only one keyword per subschema, so each object leaves here in exactly
one of its two forms: declared properties (`properties` + `required`, nothing else
generated but, for an open object, `extraKeys` after them) or free keys
(`additionalProperties` + `minProperties`/`maxProperties`).
"""

from __future__ import annotations

from collections.abc import Callable

from gclm.compiler.json_schema.ops import Node, escape_pointer
from gclm.errors import UnsupportedSchemaError


class Finisher:
    """Turn internal nodes into the plain JSON Schema outlines-core receives."""

    def __init__(self, note: Callable[[str, str], None]):
        self.note = note

    def finish(self, node: Node, ptr: str) -> Node:
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
            # Undeclared keys after the declared ones (see `open_objects.py`).
            out["extraKeys"] = self.finish(extra, f"{ptr}/additionalProperties")
        return out
