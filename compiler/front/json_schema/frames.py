"""A JSON Schema whose `$ref`s recurse, as frames for the pushdown masks.

compiler/front/json_schema/normalize.py unrolls a recursive `$ref` `max_recursion` deep.
Here a `$ref` to a definition already being expanded becomes a call instead (a FrameCall,
compiler/front/json_schema/calls.py): the output is frame 0, each recursive definition a
frame of its own, and each frame's regex holds one placeholder character per call, which
compiler/grown/pushdown.py makes a call edge. A schema whose recursion meets a rewrite that
must read the called definition (a `$ref` beside other keywords, a proof under `not` or
`oneOf`) answers None, and is unrolled as before.

A schema whose regex passes the size limit, written with every `$ref` a call or with none
to call, can be split instead (`split=True`): each subschema whose own regex would pass
SPLIT_CHARS, once its own parts are split, becomes a frame called where it stood. A call
is one character in its caller's regex wherever the caller's regex repeats it (an array's
items are written twice, an object's optional properties once per alternative that may
hold them: quadratic in their number), so the frames together are about as large as the
schema's distinct subschemas.
"""

from __future__ import annotations

import json
from typing import Any

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.deadline import check
from gclm.compiler.front.grammar.frames import GrammarFrames
from gclm.compiler.front.grammar.rx import Rx
from gclm.compiler.front.json_schema.calls import NEAR_CALLS, FrameCall, OpaqueCall
from gclm.compiler.front.json_schema.finish import Finisher
from gclm.compiler.front.json_schema.normalize import Normalizer, SchemaLimits
from gclm.compiler.front.json_schema.ops import canonical, escape_pointer
from gclm.compiler.front.json_schema.refs import Refs
from gclm.compiler.front.json_schema.regex import regex_size, schema_regex
from gclm.errors import ConstraintError

# Normalisations one schema may take, each writing inline one more definition a rewrite
# had to read.
MAX_ATTEMPTS = 16
# A split schema's subschemas whose regex, their own parts split, is longer than this are
# frames of their own.
SPLIT_CHARS = 2_000


def recursive_refs(schema: Any) -> bool:
    """Whether some `$ref` of `schema` leads back to itself (a definition that contains,
    through `$ref`s, a `$ref` to itself). Each target's subschema is read once."""
    refs = Refs(schema)
    state: dict[str, int] = {}  # pointer -> 1 being read, 2 read
    targets: dict[str, Any] = {"": schema}
    stack: list[tuple[str, list[str]]] = [("", _refs_in(schema))]
    state[""] = 1
    while stack:
        ptr, todo = stack[-1]
        if not todo:
            state[ptr] = 2
            stack.pop()
            continue
        ref = todo.pop()
        try:
            target_ptr, target = refs.resolve(ref, ptr)
        except ConstraintError:
            continue  # normalisation reports it
        mark = state.get(target_ptr, 0)
        if mark == 1:
            return True
        if mark == 0:
            state[target_ptr] = 1
            targets[target_ptr] = target
            stack.append((target_ptr, _refs_in(target)))
    return False


def _refs_in(node: Any) -> list[str]:
    """The `$ref` strings anywhere inside `node` (not through them)."""
    found: list[str] = []
    todo = [node]
    while todo:
        x = todo.pop()
        if isinstance(x, dict):
            ref = x.get("$ref")
            if isinstance(ref, str):
                found.append(ref)
            todo.extend(x.values())
        elif isinstance(x, list):
            todo.extend(x)
    return found


def schema_frames(
    c: Constraint,
    limits: SchemaLimits | None = None,
    *,
    every_ref: bool = False,
    split: bool = False,
) -> GrammarFrames | None:
    """The frames of a json_schema constraint whose `$ref`s recurse, or None where none do
    or where the recursion cannot be kept as calls (then it is unrolled). `every_ref`:
    every `$ref` is a call, not only those that recurse (each definition written once:
    a schema whose `$ref`s expand past the regex limit when inlined, recursive or not).
    `split`: large subschemas are frames too (see the module docstring), `$ref`s or not.

    Raises as compiler/front/regex.py's json_regex does."""
    if c.kind != "json_schema" or NEAR_CALLS.search(c.spec):
        return None
    if '"$ref"' not in c.spec and not split:
        return None
    schema = json.loads(c.spec)
    if not every_ref and not split and not recursive_refs(schema):
        return None
    from gclm.compiler.front.regex import check_depth

    check_depth(schema)
    inline: set[str] = set()
    for _ in range(MAX_ATTEMPTS):
        try:
            return _frames(c, schema, limits or SchemaLimits(), every_ref, inline, split)
        except OpaqueCall as e:
            # A rewrite read a call: with every $ref a call, write that definition inline
            # and try again (a recursive one cannot be: it is called inside itself).
            if not every_ref or e.ptr is None or e.ptr in inline:
                return None
            inline.add(e.ptr)
    return None


def _frames(
    c: Constraint,
    schema: Any,
    limits: SchemaLimits,
    every_ref: bool,
    inline: set[str],
    split: bool = False,
) -> GrammarFrames | None:
    normalizer = Normalizer(schema, limits, open_objects=c.additional_properties == "spec")
    calls: dict[str, tuple[int, Any]] = {}
    normalizer.calls = calls
    normalizer.call_every_ref = every_ref
    normalizer.inline = inline
    finisher = Finisher(normalizer.note)
    root = normalizer.schema(schema, "")
    if not calls and not split:
        return None
    if root is None:
        raise ConstraintError("No JSON value satisfies this JSON Schema; check its constraints.")
    nodes: dict[int, Any] = {0: finisher.finish(root, "")}
    names = {0: "/"}
    while len(nodes) <= len(calls):
        for ptr, (frame, target) in list(calls.items()):
            if frame in nodes:
                continue
            normalizer.stack = [ptr]
            node = normalizer.schema(target, ptr)
            normalizer.stack = []
            nodes[frame] = None if node is None else finisher.finish(node, ptr)
            names[frame] = ptr or "/"
    if split:
        splitter = _Splitter(len(nodes))
        for f in list(nodes):
            if nodes[f] is not None:
                nodes[f] = splitter.children(nodes[f], names[f].rstrip("/"))
        nodes.update(splitter.nodes)
        names.update(splitter.names)
    texts = [schema_regex(nodes[0], c.whitespace)] + [
        None if nodes[f] is None else schema_regex(nodes[f], c.whitespace, top_level=False)
        for f in range(1, len(nodes))
    ]
    return GrammarFrames(
        tuple(None if t is None else Rx(t, False) for t in texts),
        tuple(names[f] for f in range(len(nodes))),
        tuple(0 for _ in nodes),
        text_calls=True,
    )


class _Splitter:
    """Splits finished subschemas into frames (`schema_frames`' `split`), bottom up: a
    subschema's own parts first, then the subschema itself if its regex is still longer
    than SPLIT_CHARS. Frames are numbered from `first`; a subschema met twice (one node
    shared) is one frame."""

    def __init__(self, first: int) -> None:
        self.next = first
        self.nodes: dict[int, Any] = {}
        self.names: dict[int, str] = {}
        self._made: dict[int, FrameCall] = {}
        self._same: dict[str, FrameCall] = {}  # by its text: copies of one definition
        self._sizes: dict[int, int] = {}  # by id: every node measured is kept alive
        self._measured: list[Any] = []

    def children(self, node: Any, ptr: str) -> Any:
        """`node` with its large subschemas called (a copy where any is)."""
        if not isinstance(node, dict) or isinstance(node, FrameCall):
            return node
        out = dict(node)
        for key in ("items", "additionalProperties", "extraKeys"):
            if isinstance(node.get(key), dict):
                out[key] = self._part(node[key], f"{ptr}/{key}")
        for key in ("anyOf", "prefixItems"):
            if isinstance(node.get(key), list):
                out[key] = [self._part(x, f"{ptr}/{key}/{i}") for i, x in enumerate(node[key])]
        if isinstance(node.get("properties"), dict):
            out["properties"] = {
                name: self._part(sub, f"{ptr}/properties/{escape_pointer(name)}")
                for name, sub in node["properties"].items()
            }
        return out

    def _part(self, node: Any, ptr: str) -> Any:
        """`node`, split, or a call to it when it is still large."""
        if not isinstance(node, dict) or isinstance(node, FrameCall):
            return node
        made = self._made.get(id(node))
        if made is not None:
            return made
        check()  # the request's deadline (compiler/front/deadline.py)
        inner = self.children(node, ptr)
        self._measured.append(inner)
        if regex_size(inner, self._sizes, leaves=True) <= SPLIT_CHARS:
            return inner
        text = canonical(inner)
        call = self._same.get(text)
        if call is None:
            call = self._same[text] = FrameCall(self.next)
            self.nodes[self.next], self.names[self.next] = inner, ptr
            self.next += 1
        self._made[id(node)] = call
        return call
