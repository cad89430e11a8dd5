"""Resolve local `$ref`s: JSON pointers (`#/$defs/x`) and anchors (`#name`).

Only references into the same document are followed; gclm fetches nothing.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from gclm.compiler.front.json_schema.ops import escape_pointer
from gclm.errors import ConstraintError, UnsupportedSchemaError, cut, quote


class Refs:
    """The `$ref` targets of one schema document."""

    def __init__(self, root: Any):
        self.root = root
        self._anchors: dict[str, str] | None = None

    def resolve(self, ref: str, ptr: str) -> tuple[str, Any]:
        """(JSON pointer, subschema) that `ref`, found at `ptr`, names.

        Raises:
            UnsupportedSchemaError: a reference to another document.
            ConstraintError: a reference to nothing.
        """
        base, _, fragment = ref.partition("#")
        root_ids = (
            {self.root.get("$id"), self.root.get("id")} if isinstance(self.root, dict) else set()
        )
        if base and base not in root_ids:
            raise UnsupportedSchemaError(
                "$ref", ptr, f"external reference {quote(ref)}; copy its schema under $defs"
            )
        if fragment and not fragment.startswith("/"):
            fragment = self._anchor(fragment, ref, ptr)
        node: Any = self.root
        for token in fragment.split("/")[1:]:
            token = unquote(token).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and token in node:
                node = node[token]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                raise ConstraintError(
                    f"$ref {quote(ref)} at {cut(ptr or '/')} points at nothing in the schema."
                )
        return fragment, node

    def _anchor(self, name: str, ref: str, ptr: str) -> str:
        if self._anchors is None:
            self._anchors = {}
            todo: list[tuple[str, Any]] = [("", self.root)]
            while todo:
                where, s = todo.pop()
                if isinstance(s, dict):
                    # 2019+ spells an anchor `$anchor`; Draft 6-7 spell it `$id: "#name"`.
                    names = [s.get("$anchor")] + [
                        s.get(k, "")[1:] for k in ("$id", "id") if str(s.get(k, "")).startswith("#")
                    ]
                    for anchor in names:
                        if isinstance(anchor, str) and anchor:
                            self._anchors.setdefault(anchor, where)
                    todo += [(f"{where}/{escape_pointer(k)}", v) for k, v in s.items()]
                elif isinstance(s, list):
                    todo += [(f"{where}/{i}", v) for i, v in enumerate(s)]
        if name not in self._anchors:
            raise ConstraintError(
                f"$ref {quote(ref)} at {cut(ptr or '/')} names no anchor in the schema."
            )
        return self._anchors[name]
