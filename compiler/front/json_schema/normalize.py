"""Normalise a JSON Schema into the subset outlines-core 0.2.14 compiles faithfully.

outlines-core reads one keyword per subschema (the first of properties, allOf, anyOf,
oneOf, prefixItems, enum, const, $ref, type) and silently ignores the rest, so
`{"type": "string", "enum": ["a", 1]}` may emit `1` and `allOf` is pasted end to end. It
also ignores numeric bounds, `uniqueItems`, `contains`, `not`, `if`, dependencies and
`required` names that are not declared. `normalize_schema` rewrites a schema into nodes
that each say exactly one thing (see `compiler/front/json_schema/ops.py`), resolving `$ref`s,
intersecting `allOf`, and distributing `anyOf`. Every node generates a subset of what the
original schema accepts; a keyword that cannot be kept that way raises
UnsupportedSchemaError with its JSON pointer. Annotations are dropped, and each rewrite
that changes what is generated is reported in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from typing import Any

from gclm.compiler.front.deadline import check
from gclm.compiler.front.json_schema.calls import MAX_CALLS, FrameCall, OpaqueCall
from gclm.compiler.front.json_schema.exclusions import (
    discriminated,
    exclusive_object,
    narrowing,
    without_optional,
)
from gclm.compiler.front.json_schema.finish import Finisher
from gclm.compiler.front.json_schema.numbers import number_regex
from gclm.compiler.front.json_schema.objects import object_node
from gclm.compiler.front.json_schema.ops import (
    ASSERTIONS,
    Node,
    any_node,
    array_node,
    array_of,
    branches,
    count_of,
    dedupe,
    escape_pointer,
    is_any,
    keyword_types,
    meet,
    number_of,
    union,
)
from gclm.compiler.front.json_schema.patterns import CHECKED_FORMATS, FORMATS, string_regex
from gclm.compiler.front.json_schema.proofs import Prover
from gclm.compiler.front.json_schema.refs import Refs
from gclm.errors import CompileLimitError, ConstraintError, UnsupportedSchemaError, cut, quote


@dataclass(frozen=True)
class SchemaLimits:
    """Bounds that keep a schema's automaton small; each one is reported when it applies.

    any_depth: a `{}` subschema becomes any JSON value nested at most this deep (1: a
        scalar, or a flat array or object of scalars). Each level multiplies the automaton
        by about 4.
    max_recursion: how many times one definition may be expanded inside itself (outlines-core
        itself allows 3 `$ref`s in a row in all). Regex size grows geometrically with it.
    length_cap: a `maxLength` above this is lowered to it. Each counted character is a few
        automaton states over the whole vocabulary: 256 takes ~1.7 s to index on its own.
    free_object_depth: the values of a free-form object (`"type": "object"` with no declared
        properties and no additionalProperties schema) nest at most this deep: documents put
        arrays of objects there (`{"steps": [{"a": 1}]}`). See compiler/front/regex.py for the
        fallback to any_depth when that makes the regex too long.
    """

    any_depth: int = 1
    max_recursion: int = 3
    length_cap: int = 256
    free_object_depth: int = 2

    def __post_init__(self) -> None:
        for name in ("any_depth", "max_recursion", "length_cap", "free_object_depth"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"SchemaLimits.{name} must be a non-negative integer.")


# A minLength or minItems past this is refused at once: each required character or item is
# automaton states over the whole vocabulary (256 characters take ~1.7 s to index), so a
# larger one only runs into the compile CPU limit, and `minLength: 1e9` would hold a worker
# for that long at every retry on a loaded machine before its 400.
MAX_MINIMUM = 10_000

# Inlining a $ref that is not recursive is memoised; recursive ones are expanded afresh
# each time, and a DAG of them can multiply. Past this many expansions we stop.
MAX_REF_EXPANSIONS = 20_000

TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")
ANNOTATIONS = {
    "title",
    "description",
    "default",
    "examples",
    "example",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
    "contentMediaType",
    "contentEncoding",
    "contentSchema",
    "$schema",
    "$id",
    "id",
    "$anchor",
    "$dynamicAnchor",
    "$recursiveAnchor",
    "$vocabulary",
    "$defs",
    "definitions",
    "minContains",
    "maxContains",
    "then",
    "else",
}


def normalize_schema(
    schema: dict[str, Any] | bool,
    limits: SchemaLimits | None = None,
    *,
    additional_properties: str = "declared",
) -> tuple[dict[str, Any], list[str]]:
    """Rewrite `schema` into outlines-core's faithful subset.

    Args:
        schema: a JSON Schema (Draft 4 to 2020-12), as parsed JSON.
        limits: nesting, recursion and length bounds (see SchemaLimits).
        additional_properties: where an object with declared properties leaves
            additionalProperties unsaid, "declared" generates those only, "spec" lets other
            keys follow them (as the specification allows; compiler/front/constraint.py).

    Returns:
        (normalised schema, rewrites): the schema, self-contained (no `$ref`), and one
        human-readable line per rewrite that changed what can be generated.

    Raises:
        UnsupportedSchemaError: a keyword that cannot be honoured (keyword and pointer).
        ConstraintError: a malformed schema, or one that no value satisfies.
    """
    normalizer = Normalizer(
        schema, limits or SchemaLimits(), open_objects=additional_properties == "spec"
    )
    node = normalizer.schema(schema, "")
    if node is None:
        raise ConstraintError("No JSON value satisfies this JSON Schema; check its constraints.")
    return Finisher(normalizer.note).finish(node, ""), list(normalizer.rewrites)


class Normalizer:
    """One pass over one schema: resolves refs, records rewrites, builds nodes."""

    def __init__(self, root: Any, limits: SchemaLimits, *, open_objects: bool = False):
        self.root = root
        self.limits = limits
        self.any_depth = limits.any_depth
        self.free_object_depth = limits.free_object_depth
        self.open_objects = open_objects  # other keys after the declared, where none said
        self.max_recursion = limits.max_recursion
        self.rewrites: dict[str, None] = {}  # ordered set of lines
        self.stack: list[str] = []  # ref targets being expanded
        self.memo: dict[str, Node | None] = {}
        self.cuts = 0
        self.expansions = 0
        self.refs = Refs(root)
        self.prover = Prover(lambda ref: self.refs.resolve(ref, "")[1])
        # Keeping calls (json_schema/frames.py): a $ref to a definition being expanded is a
        # FrameCall, numbered here by its target (pointer -> (frame, subschema)).
        self.calls: dict[str, tuple[int, Any]] | None = None
        self.call_every_ref = False  # every $ref a call, not only those that recurse,
        self.inline: set[str] = set()  # but those to these targets

    def note(self, pointer: str, text: str) -> None:
        self.rewrites[f"{cut(pointer or '/')}: {text}"] = None

    # --------------------------------------------------------------------- subschemas

    def schema(self, s: Any, ptr: str, within: Node | None = None) -> Node | None:
        """The node of subschema `s`; with `within`, of `s` met with that node.

        A `oneOf` or `not` of `s` (or of an allOf member that says only that) is applied
        after the meet, so its proofs see what `within` and the siblings require.
        """
        check()  # a server thread's deadline (compiler/front/deadline.py)
        if s is True or s == {}:
            return within if within is not None and not is_any(within) else self.anything(ptr)
        if s is False:
            return None
        if not isinstance(s, dict):
            raise ConstraintError(f"The subschema at {ptr or '/'} must be an object or a boolean.")
        for key in s.keys() - ASSERTIONS - ANNOTATIONS:
            self.note(f"{ptr}/{escape_pointer(key)}", f"unknown keyword {quote(key)} ignored")
        for key in ("$dynamicRef", "$recursiveRef", "unevaluatedItems"):
            if key in s and s[key] is not True:
                raise UnsupportedSchemaError(key, ptr)
        if "if" in s and ("then" in s or "else" in s):
            node = self.conditional(s, ptr)
            return node if within is None else meet(within, node, ptr)
        parts: list[Node | None] = [] if within is None else [within]
        if "$ref" in s:
            parts.append(self.ref(s["$ref"], ptr))
        types = self.types(s, ptr)
        if types is not None:
            parts.append(union([self.typed(t, s, ptr) for t in types]))
        if "const" in s:
            parts.append({"enum": [s["const"]]})
        if "enum" in s:
            values = s["enum"]
            if not isinstance(values, list) or not values:
                raise ConstraintError(f"'enum' at {ptr or '/'} must be a non-empty array.")
            parts.append({"enum": dedupe(values)})
        # An allOf member that only says `not` or `oneOf` is applied after the meet: what
        # it excludes is easier to prove once the siblings have narrowed the value.
        nots = [(s["not"], ptr)] if "not" in s else []
        one_ofs = [(array_of(s, "oneOf", ptr), ptr)] if "oneOf" in s else []
        for i, x in enumerate(array_of(s, "allOf", ptr)):
            only = (x.keys() & ASSERTIONS) if isinstance(x, dict) else set()
            if only == {"not"}:
                nots.append((x["not"], f"{ptr}/allOf/{i}"))
            elif only == {"oneOf"}:
                one_ofs.append((array_of(x, "oneOf", f"{ptr}/allOf/{i}"), f"{ptr}/allOf/{i}"))
            else:
                parts.append(self.schema(x, f"{ptr}/allOf/{i}"))
        if "anyOf" in s:
            parts.append(
                union(
                    [
                        self.schema(x, f"{ptr}/anyOf/{i}")
                        for i, x in enumerate(array_of(s, "anyOf", ptr))
                    ]
                )
            )
        if not parts:
            # Only oneOf/not (or nothing) constrains this value.
            parts.append(any_node(self.any_depth) if nots or one_ofs else self.anything(ptr))
        node = reduce(lambda a, b: meet(a, b, ptr), parts)
        for subs, where in one_ofs:
            node = self.one_of(subs, node, where)
        for sub, where in nots:
            node = self.exclude(sub, node, where)
        return node

    def conditional(self, s: dict[str, Any], ptr: str) -> Node | None:
        """`if`/`then`/`else` as anyOf [allOf [rest, if, then], allOf [rest, else, not if]].

        The `else` side keeps only values proven to fail `if` (as `not` does); where nothing
        can be proven, that side is left out (reported), and if both sides are empty the
        keyword is refused.
        """
        rest = {k: v for k, v in s.items() if k not in ("if", "then", "else")}
        node = self.schema(rest, ptr)
        cond = s["if"]
        sides = []
        for key, test in (("then", True), ("else", False)):
            side = node
            if key in s:
                side = meet(side, self.schema(s[key], f"{ptr}/{key}"), ptr)
            try:
                if test:
                    side = meet(side, self.schema(cond, f"{ptr}/if"), ptr)
                else:
                    side = self.exclude(cond, side, f"{ptr}/if")
            except UnsupportedSchemaError:
                self.note(f"{ptr}/{key}", f"values taking the '{key}' branch are not generated")
                side = None
            sides.append(side)
        if all(side is None for side in sides) and node is not None:
            raise UnsupportedSchemaError(
                "if", ptr, "gclm cannot tell which values take which branch (if/then/else)"
            )
        return union(sides)

    def anything(self, ptr: str) -> Node:
        self.note(
            ptr, f"accepts any JSON value; generating values nested at most {self.any_depth} deep"
        )
        return any_node(self.any_depth)

    def types(self, s: dict[str, Any], ptr: str) -> list[str] | None:
        if "type" in s:
            types = s["type"] if isinstance(s["type"], list) else [s["type"]]
            for t in types:
                if t not in TYPES:
                    raise ConstraintError(
                        f"Unknown type {quote(t)} at {cut(ptr or '/')}; use one of {TYPES}."
                    )
            return [t for t in types if not (t == "integer" and "number" in types)]
        inferred = sorted({t for key in s for t in keyword_types(key)})
        if inferred:
            self.note(
                ptr,
                f"no 'type'; generating only {' or '.join(inferred)} values (its keywords' types)",
            )
            return inferred
        return None

    def typed(self, t: str, s: dict[str, Any], ptr: str) -> Node | None:
        if t in ("integer", "number"):
            return self.number(t, s, ptr)
        if t == "string":
            return self.string(s, ptr)
        if t == "array":
            return self.array(s, ptr)
        if t == "object":
            return object_node(self, s, ptr)
        return {"type": t}

    def number(self, t: str, s: dict[str, Any], ptr: str) -> Node:
        node: Node = {"type": t}
        for key in ("minimum", "maximum", "multipleOf"):
            if key in s:
                node[key] = number_of(s, key, ptr)
        for key, inclusive in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
            if s.get(key) is True and inclusive in node:  # Draft 4: a flag on the bound
                node[key] = node.pop(inclusive)
            elif key in s and not isinstance(s[key], bool):
                node[key] = number_of(s, key, ptr)
        if "format" in s:
            self.note(
                f"{ptr}/format", f"format {quote(s['format'])} on a {t} is an annotation; ignored"
            )
        number_regex(node, ptr)  # raise now, with this pointer, if it cannot be built
        return node

    def string(self, s: dict[str, Any], ptr: str) -> Node | None:
        node: Node = {"type": "string"}
        for key in ("minLength", "maxLength"):
            if key in s:
                node[key] = count_of(s, key, ptr)
        if node.get("minLength", 0) > node.get("maxLength", node.get("minLength", 0)):
            return None
        _feasible_minimum(node, "minLength", ptr)
        cap = max(self.limits.length_cap, node.get("minLength", 0))
        if node.get("maxLength", 0) > cap:
            self.note(f"{ptr}/maxLength", f"maxLength {node['maxLength']} lowered to {cap}")
            node["maxLength"] = cap
        if "pattern" in s:
            if not isinstance(s["pattern"], str):
                raise ConstraintError(f"'pattern' at {ptr or '/'} must be a string.")
            node["pattern"] = s["pattern"]
        fmt = s.get("format")
        if fmt is not None and fmt not in CHECKED_FORMATS:
            self.note(
                f"{ptr}/format",
                f"unknown format {quote(fmt)} treated as a plain string "
                "(an annotation: validators do not check it)",
            )
        elif fmt is not None and fmt not in FORMATS:
            raise UnsupportedSchemaError(
                "format",
                ptr,
                f"validators check format {quote(fmt)} and gclm cannot enforce it; replace it with "
                f"a pattern, or use one of {', '.join(sorted(FORMATS))}",
            )
        elif fmt is not None:
            node["format"] = fmt
        string_regex(node, ptr)  # raise now, with this pointer, if it cannot be built
        return node

    def array(self, s: dict[str, Any], ptr: str) -> Node | None:
        min_items = count_of(s, "minItems", ptr) if "minItems" in s else 0
        max_items = count_of(s, "maxItems", ptr) if "maxItems" in s else None
        _feasible_minimum({"minItems": min_items}, "minItems", ptr)
        if s.get("uniqueItems") is True and (max_items is None or max_items > 1):
            if min_items > 1:
                raise UnsupportedSchemaError(
                    "uniqueItems", ptr, "outlines-core cannot keep items distinct"
                )
            # No automaton keeps arbitrary items distinct; one item is always unique.
            self.note(ptr, "uniqueItems: arrays generated with at most 1 item")
            max_items = 1
        contains = None
        if "contains" in s:
            tuple_form = "prefixItems" in s or isinstance(s.get("items"), list)
            if "maxContains" in s or tuple_form:
                raise UnsupportedSchemaError("contains", ptr, "with maxContains or tuple items")
            # Every item matches `contains` (at least minContains of them, 1 by default).
            contains = self.schema(s["contains"], f"{ptr}/contains")
            min_items = max(min_items, count_of(s, "minContains", ptr) if "minContains" in s else 1)
            self.note(ptr, "contains: every item generated matches it")
        items = s.get("items", True)
        prefix: list[Any] | None
        if isinstance(items, list):  # Draft 4-2019 tuple form
            prefix, rest, rest_key = items, s.get("additionalItems", True), "additionalItems"
            prefix_key = "items"
        else:
            prefix, rest, rest_key = s.get("prefixItems"), items, "items"
            prefix_key = "prefixItems"
        if prefix is None:
            item = (
                self.schema(rest, f"{ptr}/{rest_key}") if "items" in s else any_node(self.any_depth)
            )
            if "contains" in s:
                item = meet(item, contains, ptr)
            return array_node(item, min_items, max_items)
        length = len(prefix) if max_items is None else min(len(prefix), max_items)
        nodes = []
        for i, sub in enumerate(prefix[:length]):
            node = self.schema(sub, f"{ptr}/{prefix_key}/{i}")
            if node is None:
                break  # a shorter tuple is still valid
            nodes.append(node)
        if len(nodes) < min_items:
            extra = (
                self.schema(rest, f"{ptr}/{rest_key}")
                if rest is not True
                else any_node(self.any_depth)
            )
            if extra is None:
                return None
            nodes += [extra] * (min_items - len(nodes))
        if len(nodes) != len(prefix):
            self.note(ptr, f"arrays generated with exactly {len(nodes)} items")
        return {"type": "array", "prefixItems": nodes} if nodes else array_node(None, 0, 0)

    # -------------------------------------------------------------------- combinators

    def one_of(self, subs: list[Any], base: Node | None, ptr: str) -> Node | None:
        """Keep only what provably matches exactly one branch."""
        if base is None:
            return None
        kept, lost = [], False
        for i, sub in enumerate(subs):
            # Within the base, so that a branch's own oneOf/not sees the siblings too.
            generated = self.schema(sub, f"{ptr}/oneOf/{i}", within=base)
            others = subs[:i] + subs[i + 1 :]
            for b in branches(generated):
                if (e := self.proven(others, b)) is not None:
                    kept.append(e)
                elif (e := exclusive_object(self, others, b)) is not None:
                    kept.append(e)
                    self.note(
                        f"{ptr}/oneOf/{i}",
                        f"{narrowing(b, e)}, so that they match this branch only",
                    )
                else:
                    lost = True
        if lost and not kept:
            raise UnsupportedSchemaError(
                "oneOf",
                ptr,
                "gclm cannot prove its branches exclusive; use anyOf if overlap is fine",
            )
        if lost:
            self.note(
                f"{ptr}/oneOf", "values that might match more than one branch are not generated"
            )
        return union(kept)

    def proven(self, others: list[Any], branch: Node) -> Node | None:
        """`branch`, or it without extra keys, if proven to fail all of `others`; else None."""
        closed = {k: v for k, v in branch.items() if k != "open"}
        for candidate in [branch] + ([closed] if "open" in branch else []):
            if all(self.prover.rejects(o, candidate) for o in others):
                return candidate
        return None

    def exclude(self, sub: Any, node: Node | None, ptr: str) -> Node | None:
        """Keep only what provably fails the `not` subschema."""
        kept, lost = [], False
        for branch in branches(node):
            if "enum" in branch:
                verdicts = [(v, self.prover.holds(sub, v)) for v in branch["enum"]]
                values = [v for v, ok in verdicts if ok is False]
                lost |= any(ok is None for _, ok in verdicts)
                kept += [{"enum": values}] if values else []
            elif (proven := self.proven([sub], branch)) is not None:
                kept.append(proven)
            elif (narrowed := without_optional(self, sub, branch, ptr)) is not None:
                kept.append(narrowed)
            elif (narrowed := discriminated(self, sub, branch)) is not None:
                kept.append(narrowed)
                promoted = [k for k in narrowed["required"] if k not in branch["required"]]
                if promoted:
                    self.note(
                        f"{ptr}/not",
                        f"objects generated with {promoted} present, so that they fail the "
                        "'not' subschema",
                    )
            elif (narrowed := exclusive_object(self, [sub], branch)) is not None:
                kept.append(narrowed)
                self.note(
                    f"{ptr}/not",
                    f"{narrowing(branch, narrowed)}, so that they fail the 'not' subschema",
                )
            else:
                lost |= not self.prover.accepts_all(sub, branch)
        if lost and not kept:
            raise UnsupportedSchemaError("not", ptr, "gclm cannot prove which values it rejects")
        if lost:
            self.note(f"{ptr}/not", "only values proven to fail the 'not' subschema are generated")
        return union(kept)

    # ---------------------------------------------------------------------- $ref

    def ref(self, ref: Any, ptr: str) -> Node | None:
        if not isinstance(ref, str):
            raise ConstraintError(f"'$ref' at {ptr or '/'} must be a string.")
        target_ptr, target = self.refs.resolve(ref, ptr)
        if self.calls is not None and (
            target_ptr in self.stack or self.call_every_ref and target_ptr not in self.inline
        ):
            found = self.calls.get(target_ptr)
            if found is None:
                if len(self.calls) + 1 >= MAX_CALLS:
                    raise OpaqueCall("more definitions called than call characters")
                found = self.calls[target_ptr] = (len(self.calls) + 1, target)
            return FrameCall(found[0], target_ptr)
        if target_ptr in self.memo:
            return self.memo[target_ptr]
        if self.stack.count(target_ptr) >= self.max_recursion:
            self.cuts += 1
            self.note(
                ptr,
                f"recursive $ref {quote(ref)} cut after {self.max_recursion} levels; "
                "deeper values are not generated",
            )
            return None
        self.expansions += 1
        if self.expansions > MAX_REF_EXPANSIONS:
            raise CompileLimitError(
                f"The schema's $refs expand to more than {MAX_REF_EXPANSIONS:,} subschemas; "
                "no automaton that size compiles in time. Reduce nesting or recursion."
            )
        self.stack.append(target_ptr)
        cuts = self.cuts
        try:
            node = self.schema(target, target_ptr)
        finally:
            self.stack.pop()
        if self.cuts == cuts:  # no recursion was cut, so the result holds in any context
            self.memo[target_ptr] = node
        return node


def _feasible_minimum(node: Node, key: str, ptr: str) -> None:
    """Refuse a `minLength`/`minItems` past MAX_MINIMUM before any automaton is built."""
    value = node.get(key, 0)
    if value > MAX_MINIMUM:
        raise CompileLimitError(
            f"{key} {value:,} at {ptr or '/'} is over gclm's limit of {MAX_MINIMUM:,}: every "
            "required character or item adds automaton states over the whole vocabulary, so "
            "this cannot compile within the compile limits (nor fit a model's context). "
            f"Lower {key}."
        )
