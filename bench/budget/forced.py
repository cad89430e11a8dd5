"""Which budgets leave room for a non-degenerate output: the *forced* measure of the budget table.

A cell (schema, budget B) is *forced* when every output the table accepts within B tokens is
degenerate (bench/budget/metrics.py: valid, at least one slot, every slot at its minimum):
then no policy can do better than the mask there. This module bounds the fewest tokens of a
non-degenerate output from both sides, with the compiler itself:

- Lower bound. A non-degenerate output has a non-hollow slot or no slot at all. Over the
  schema as gclm normalises it (`normalize_schema`: refs inlined, allOf merged, each node
  one place of the output), one *variant* per way of being non-hollow narrows one node:
  a string node gets minLength + 1, an array node minItems + 1, an object node one of its
  properties required with a non-empty value (a free-keyed object: minProperties >= 1), an
  enum node its non-empty values; one more variant keeps only slot-free values (no string,
  no array). A non-hollow slot's value has more than the normalised node's minimum (the
  metric's minimum is the largest over every schema that applies there, at least the
  node's), so every non-degenerate output of the schema is an output of some variant, and
  the fewest tokens of any is at least the least `min_tokens` of the compiled variants.
  This assumes what the compiler is built on: it writes one node's regex the same way
  whatever the other nodes say, so a variant accepts every output of the schema that
  meets the narrowed node.
- Upper bound (a witness). A variant's shortest output that the original table accepts
  in that many tokens, that validates and that the metric scores not degenerate is a
  non-degenerate output of that many tokens: no assumption.

When the two meet, `fewest` is exact: a budget below it is proven forced, one at or above it
is proven not forced. Where they do not meet, a budget between them is *unknown*, and is
counted as not forced (so the forced share never claims more than is proven).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from bench.budget.metrics import _children, _dict, _expand, _int, _list

Node = dict[str, Any]
_EMPTY: list[Any] = ["", [], {}, None]


@dataclass(frozen=True)
class Fewest:
    """Bounds on the fewest tokens of a non-degenerate output of one schema.

    lower: no non-degenerate output has fewer tokens (None: none exists at all).
    upper: a non-degenerate output with this many tokens exists (None: none was found).
    witness: that output's text.
    variants: how many narrowed schemas were compiled.
    """

    lower: int | None
    upper: int | None
    witness: str = ""
    variants: int = 0

    def forced(self, budget: int) -> bool | None:
        """True: every output within `budget` tokens is degenerate (proven); False: a
        non-degenerate output fits (shown); None: unknown."""
        if self.upper is not None and self.upper <= budget:
            return False
        if self.lower is None or budget < self.lower:
            return True
        return None


class Place:
    """The metric's view of one place of the output (bench/budget/metrics.hollow_slots):
    the original schema's nodes that apply there, found by the same walk."""

    def __init__(self, root: Any, nodes: list[Any]) -> None:
        self.root = root
        self.nodes = [x for n in nodes for x in _expand(n, root)]

    def child(self, key: str | int) -> Place:
        return Place(self.root, _children(self.nodes, key))

    def min_length(self) -> int:
        """A string here is hollow up to this length."""
        return max((_int(n.get("minLength")) for n in self.nodes), default=0)

    def min_items(self) -> int:
        """An array here is hollow up to this many items."""
        return max((_int(n.get("minItems")) for n in self.nodes), default=0)

    def optional(self) -> set[str]:
        """An object here is a slot if this is not empty; hollow unless one of these keys
        holds a non-empty value."""
        required = {k for n in self.nodes for k in _list(n.get("required"))}
        return {k for n in self.nodes for k in _dict(n.get("properties"))} - required


def slot_variants(node: Node, schema: Any) -> Iterator[tuple[str, Node | None, bool]]:
    """(where, narrowed copy of the normalised schema `node`, exact) for the original
    `schema`: one copy per way a place of the output can be non-hollow (None: no value
    meets it), plus the slot-free copy ("/(slot-free)"). `exact` is False where the copy
    may miss outputs that are non-hollow there (a value under a free key: its place in the
    metric depends on the key); the lower bound then cannot rest on it. See the module
    docstring."""
    top = Place(schema, [schema])
    yield from _places(node, top, "")
    yield "/(slot-free)", _slot_free(node, top), True


def _places(node: Any, place: Place, ptr: str) -> Iterator[tuple[str, Node | None, bool]]:
    """Narrowed copies of `node`: one per narrowing of one node at or under it."""
    if not isinstance(node, dict):
        return
    if "anyOf" in node:
        for i, branch in enumerate(node["anyOf"]):
            # Other branches are dropped: the narrowed node is the one that generated it.
            yield from _places(branch, place, f"{ptr}/anyOf/{i}")
        return
    for narrowed in _own(node, place):
        yield ptr or "/", narrowed, True
    kind = node.get("type")
    if kind == "array":
        prefix = node.get("prefixItems")
        if prefix is not None:  # a tuple: every item is there
            for i, item in enumerate(prefix):
                for where, new, exact in _places(item, place.child(i), f"{ptr}/{i}"):
                    items = [new if j == i else x for j, x in enumerate(prefix)]
                    yield where, None if new is None else {**node, "prefixItems": items}, exact
        elif isinstance(node.get("items"), dict):
            # An array with more items than the metric's minimum is non-hollow itself (the
            # copy from _own); a non-hollow item in a shorter one is at one of its places.
            item = node["items"]
            for length in range(node.get("minItems", 0), place.min_items() + 1):
                for j in range(length):
                    for where, new, exact in _places(item, place.child(j), f"{ptr}/{j}"):
                        items = [new if i == j else item for i in range(length)]
                        variant = {"type": "array", "prefixItems": items}
                        yield where, None if new is None else variant, exact
    elif kind == "object":
        props = node.get("properties")
        if props is not None:
            for key, sub in props.items():
                for where, new, exact in _places(sub, place.child(key), f"{ptr}/{key}"):
                    required = list(dict.fromkeys([*node.get("required", []), key]))
                    variant = {**node, "properties": {**props, key: new}, "required": required}
                    yield where, None if new is None else variant, exact
        elif isinstance(node.get("additionalProperties"), dict):
            # A free key's place in the metric depends on the key: not exact.
            extra = node["additionalProperties"]
            for where, new, _ in _places(extra, place.child("\x00"), f"{ptr}/*"):
                yield where, None if new is None else _one_key(node, new), False


def _one_key(node: Node, value: Node) -> Node:
    """A free-keyed object with at least one key, whose values come from `value`."""
    return {
        **node,
        "additionalProperties": value,
        "minProperties": max(node.get("minProperties", 0), 1),
    }


def _own(node: Node, place: Place) -> Iterator[Node | None]:
    """Copies of `node` narrowed so that its value is a non-hollow slot."""
    kind = node.get("type")
    if "enum" in node:
        # A superset: every literal that is, or may hold, a non-hollow slot.
        kept = [v for v in node["enum"] if v not in _EMPTY and isinstance(v, (str, list, dict))]
        yield {"enum": kept} if kept else None
    elif kind == "string":
        least = max(node.get("minLength", 0), place.min_length()) + 1
        yield None if least > node.get("maxLength", least) else {**node, "minLength": least}
    elif kind == "array" and "prefixItems" in node:  # a tuple: its length is fixed
        yield node if len(node["prefixItems"]) > place.min_items() else None
    elif kind == "array":
        least = max(node.get("minItems", 0), place.min_items()) + 1
        yield None if least > node.get("maxItems", least) else {**node, "minItems": least}
    elif kind == "object":
        optional = place.optional()
        props = node.get("properties")
        if props is None:
            # Free keys: a superset, any key (a non-hollow object has one).
            if optional and isinstance(node.get("additionalProperties"), dict):
                yield _one_key(node, node["additionalProperties"])
            return
        for key, sub in props.items():
            value = _non_empty(sub) if key in optional else None
            if value is not None:
                required = list(dict.fromkeys([*node.get("required", []), key]))
                yield {**node, "properties": {**props, key: value}, "required": required}


def _non_empty(node: Any) -> Node | None:
    """`node` narrowed to values other than "", [], {} and null (None: it has none)."""
    if not isinstance(node, dict):
        return None
    if "anyOf" in node:
        return _any([_non_empty(x) for x in node["anyOf"]])
    if "enum" in node:
        kept = [v for v in node["enum"] if v not in _EMPTY]
        return {"enum": kept} if kept else None
    kind = node.get("type")
    if kind == "null":
        return None
    if kind == "string":
        least = max(node.get("minLength", 0), 1)
        return None if least > node.get("maxLength", least) else {**node, "minLength": least}
    if kind == "array" and "prefixItems" in node:
        return node if node["prefixItems"] else None
    if kind == "array":
        least = max(node.get("minItems", 0), 1)
        return None if least > node.get("maxItems", least) else {**node, "minItems": least}
    if kind == "object":
        props = node.get("properties")
        if props is None:
            extra = node.get("additionalProperties")
            return _one_key(node, extra) if isinstance(extra, dict) else None
        if node.get("required"):
            return node
        # At least one of its properties: one branch per property.
        return _any([{**node, "required": [key]} for key in props])
    return node


def _any(branches: list[Node | None]) -> Node | None:
    kept = [b for b in branches if b is not None]
    return {"anyOf": kept} if len(kept) > 1 else (kept[0] if kept else None)


def _slot_free(node: Any, place: Place | None) -> Node | None:
    """`node` narrowed to a superset of its values with no slot: no string, no array, no
    object where the metric sees optional properties (`place` None: the place is not known,
    every object is kept). None: it has no such value."""
    if not isinstance(node, dict):
        return None
    if "anyOf" in node:
        return _any([_slot_free(x, place) for x in node["anyOf"]])
    if "enum" in node:
        kept = [v for v in node["enum"] if not _holds_text(v)]
        return {"enum": kept} if kept else None
    kind = node.get("type")
    if kind in ("string", "array"):
        return None
    if kind != "object":
        return node
    if place is not None and place.optional():
        return None  # an object here is a slot
    props = node.get("properties")
    if props is None:
        extra = node.get("additionalProperties")
        value = _slot_free(extra, None) if isinstance(extra, dict) else None
        if value is not None:
            return {**node, "additionalProperties": value}
        return None if node.get("minProperties", 0) > 0 else {"type": "object", "properties": {}}
    out = {}
    required = node.get("required", [])
    for key, sub in props.items():
        value = _slot_free(sub, None if place is None else place.child(key))
        if value is not None:
            out[key] = value
        elif key in required:
            return None
    return {**node, "properties": out, "required": [k for k in required if k in out]}


def _holds_text(value: Any) -> bool:
    """Whether a literal holds a string or an array anywhere (then it has a slot)."""
    if isinstance(value, (str, list)):
        return True
    if isinstance(value, dict):
        return any(_holds_text(v) for v in value.values())
    return False


def fewest_non_degenerate(
    schema: Any,
    table: Any,
    vocab: Any,
    is_degenerate: Callable[[str], bool | None],
    whitespace: str | None = None,
    limits: Any = None,
) -> Fewest:
    """Bounds on the fewest tokens of a non-degenerate output of `schema` (see the module
    docstring).

    Args:
        schema: the JSON Schema; `table` its compiled table (min_tokens, shortest_output,
            next_state, accepting) for `vocab` (a TokenVocabulary).
        is_degenerate: the metric on one output text: True (degenerate), False (valid and
            not degenerate), None (not valid).
        whitespace: the constraint's whitespace pattern (default: gclm's).
        limits: the SchemaLimits the table was compiled with (default: gclm's).
    """
    import outlines_core

    from bench.outlines_index import table_from_index
    from gclm.compiler.front.constraint import DEFAULT_WHITESPACE
    from gclm.compiler.front.json_schema import normalize_schema, schema_regex
    from gclm.compiler.whole.tables import shortest_path
    from gclm.errors import ConstraintError, GclmError

    if is_degenerate(table.shortest_output) is False:
        return Fewest(table.min_tokens, table.min_tokens, table.shortest_output)
    node, _ = normalize_schema(copy.deepcopy(schema), limits)
    lower: int | None = None
    upper: int | None = None
    witness = ""
    count = 0
    for _, variant, exact in slot_variants(node, schema):
        if variant is None:
            continue  # no value is non-hollow there
        try:
            regex = schema_regex(variant, whitespace or DEFAULT_WHITESPACE)
            index = outlines_core.Index(f"(?:{regex})$", vocab.outlines)
            narrowed = table_from_index(index, vocab)
        except ConstraintError as e:
            if str(e).startswith(_NO_OUTPUT):
                continue  # no output meets the narrowing (within the vocabulary)
            m = table.min_tokens  # unknown: only the plain table's minimum bounds it
        except (GclmError, ValueError, RuntimeError):
            m = table.min_tokens
        else:
            count += 1
            m = narrowed.min_tokens
            if upper is None or m < upper:
                ids = shortest_path(narrowed)
                text = b"".join(vocab.token_bytes[t] or b"" for t in ids)
                decoded = text.decode("utf-8", "replace")
                if _accepts(table, ids) and is_degenerate(decoded) is False:
                    upper, witness = m, decoded
            if not exact:
                m = table.min_tokens
        lower = m if lower is None else min(lower, m)
    return Fewest(lower, upper, witness, count)


# How table_from_grouped says that the narrowed constraint has no output.
_NO_OUTPUT = "No output satisfies the constraint"


def _accepts(table: Any, ids: list[int]) -> bool:
    state = table.initial
    for token in ids:
        state = table.next_state(state, token)
        if state < 0:
            return False
    return bool(table.accepting[state])
