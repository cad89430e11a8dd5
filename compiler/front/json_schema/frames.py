"""A JSON Schema whose `$ref`s recurse, as frames for the pushdown masks.

compiler/front/json_schema/normalize.py unrolls a recursive `$ref` `max_recursion` deep.
Here a `$ref` to a definition already being expanded becomes a call instead (a FrameCall,
compiler/front/json_schema/calls.py): the output is frame 0, each recursive definition a
frame of its own, and each frame's regex holds one placeholder character per call, which
compiler/grown/pushdown.py makes a call edge. A schema whose recursion meets a rewrite that
must read the called definition (a `$ref` beside other keywords, a proof under `not` or
`oneOf`) answers None, and is unrolled as before.
"""

from __future__ import annotations

import json
from typing import Any

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.grammar.frames import GrammarFrames
from gclm.compiler.front.grammar.rx import Rx
from gclm.compiler.front.json_schema.calls import NEAR_CALLS, OpaqueCall
from gclm.compiler.front.json_schema.finish import Finisher
from gclm.compiler.front.json_schema.normalize import Normalizer, SchemaLimits
from gclm.compiler.front.json_schema.refs import Refs
from gclm.compiler.front.json_schema.regex import schema_regex
from gclm.errors import ConstraintError

# Normalisations one schema may take, each writing inline one more definition a rewrite
# had to read.
MAX_ATTEMPTS = 16


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
    c: Constraint, limits: SchemaLimits | None = None, *, every_ref: bool = False
) -> GrammarFrames | None:
    """The frames of a json_schema constraint whose `$ref`s recurse, or None where none do
    or where the recursion cannot be kept as calls (then it is unrolled). `every_ref`:
    every `$ref` is a call, not only those that recurse (each definition written once:
    a schema whose `$ref`s expand past the regex limit when inlined, recursive or not).

    Raises as compiler/front/regex.py's json_regex does."""
    if c.kind != "json_schema" or '"$ref"' not in c.spec or NEAR_CALLS.search(c.spec):
        return None
    schema = json.loads(c.spec)
    if not every_ref and not recursive_refs(schema):
        return None
    from gclm.compiler.front.regex import check_depth

    check_depth(schema)
    inline: set[str] = set()
    for _ in range(MAX_ATTEMPTS):
        try:
            return _frames(c, schema, limits or SchemaLimits(), every_ref, inline)
        except OpaqueCall as e:
            # A rewrite read a call: with every $ref a call, write that definition inline
            # and try again (a recursive one cannot be: it is called inside itself).
            if not every_ref or e.ptr is None or e.ptr in inline:
                return None
            inline.add(e.ptr)
    return None


def _frames(
    c: Constraint, schema: Any, limits: SchemaLimits, every_ref: bool, inline: set[str]
) -> GrammarFrames | None:
    normalizer = Normalizer(schema, limits, open_objects=c.additional_properties == "spec")
    calls: dict[str, tuple[int, Any]] = {}
    normalizer.calls = calls
    normalizer.call_every_ref = every_ref
    normalizer.inline = inline
    finisher = Finisher(normalizer.note)
    root = normalizer.schema(schema, "")
    if not calls:
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
