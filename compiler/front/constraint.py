"""What a request asks for: a JSON Schema, any JSON object, a regex, a Lark grammar, or a
choice of strings."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gclm.errors import ConstraintError, quote

# Between JSON tokens allow at most one space. outlines-core's default, [\n\t ]*, lets a
# model spend its whole budget on whitespace.
DEFAULT_WHITESPACE = r"[ ]?"

KINDS = ("json_schema", "json_object", "regex", "grammar", "choice")
# The keys of a structured-outputs dict, each naming one kind of constraint.
STRUCTURED_KEYS = ("json", "regex", "choice", "grammar")
# A structured-outputs dict's option beside "json" (vLLM's name): true keeps objects to
# their declared properties, false lets other keys follow them.
DISABLE_ADDITIONAL_KEY = "disable_additional_properties"
# Where a JSON Schema object with declared properties leaves additionalProperties unsaid:
# "declared" generates the declared properties only; "spec" also accepts other keys after
# them, with any value, as the specification allows (a larger automaton: docs/schema.md).
ADDITIONAL_PROPERTIES = ("declared", "spec")
# The syntaxes of a grammar (OpenAI's custom tools name these two).
GRAMMAR_SYNTAXES = ("lark", "regex")


@dataclass(frozen=True)
class Constraint:
    """A constraint in canonical form: `spec` is text, so the dataclass is hashable.

    - json_schema: `spec` is the schema as compact JSON. Keys keep their order: the order of
      `properties` is the order in which the output writes them.
    - json_object: `spec` is ""
    - regex: `spec` is the pattern
    - grammar: `spec` is the Lark grammar's text (compiler/front/grammar/)
    - choice: `spec` is the JSON list of choices

    `additional_properties` (json_schema only) is one of ADDITIONAL_PROPERTIES.
    `calls` (regex only): Lark grammars whose rules recurse, which `calls_pattern` (the
    pattern again) calls where `spec` has them unrolled: the character U+F0001 + i stands
    for a text in `calls[i]` (a tool call's custom tools: server/openai/tools/prompt.py).
    `pushdown` (grammar, json_schema, a regex with calls): rules that recurse inside their
    alternatives, and `$ref`s that lead back to themselves, are served with a stack by the
    server's own masks (compiler/grown/pushdown.py), not unrolled into a regex; such a
    constraint has no whole table (where its recursion cannot be kept, it is unrolled under
    this key too).
    """

    kind: str
    spec: str
    whitespace: str = DEFAULT_WHITESPACE
    additional_properties: str = "declared"
    pushdown: bool = False
    calls: tuple[str, ...] = ()
    calls_pattern: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConstraintError(f"Unknown constraint kind {self.kind!r}; use one of {KINDS}.")
        if self.additional_properties not in ADDITIONAL_PROPERTIES:
            raise ConstraintError(
                f"additional_properties must be one of {', '.join(ADDITIONAL_PROPERTIES)}, "
                f"got {self.additional_properties!r}."
            )
        if self.additional_properties != "declared" and self.kind != "json_schema":
            raise ConstraintError("additional_properties applies to a JSON Schema only.")
        if self.calls and self.kind != "regex":
            raise ConstraintError("calls apply to a regex only.")
        if self.pushdown and self.kind not in ("grammar", "json_schema") and not self.calls:
            raise ConstraintError(
                "pushdown applies to a Lark grammar, a JSON Schema or a regex with calls only."
            )

    @classmethod
    def json_schema(
        cls,
        schema: dict[str, Any] | bool | str,
        whitespace: str = DEFAULT_WHITESPACE,
        additional_properties: str = "declared",
    ) -> Constraint:
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ConstraintError(
                    f"The JSON Schema is not valid JSON ({e.msg} at line {e.lineno} column "
                    f"{e.colno})."
                ) from e
            except RecursionError:
                raise ConstraintError(
                    "The JSON Schema nests objects or arrays too deeply to be read; "
                    "flatten it (use $defs and $ref for repeated parts)."
                ) from None
        if not isinstance(schema, dict | bool):
            raise ConstraintError(
                f"A JSON Schema must be an object (or true/false), got {type(schema).__name__}."
            )
        return cls("json_schema", canonical_json(schema), whitespace, additional_properties)

    @classmethod
    def json_object(cls, whitespace: str = DEFAULT_WHITESPACE) -> Constraint:
        return cls("json_object", "", whitespace)

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        if not isinstance(pattern, str) or not pattern:
            raise ConstraintError("A regex constraint must be a non-empty string.")
        return cls("regex", pattern)

    @classmethod
    def grammar(cls, definition: str, syntax: str = "lark") -> Constraint:
        """A grammar in `syntax`: a Lark grammar, or a regex, which is the `regex` kind (one
        constraint, one cache entry, whichever field it came from)."""
        if syntax not in GRAMMAR_SYNTAXES:
            raise ConstraintError(
                f"Unknown grammar syntax {quote(syntax)}; use one of "
                f"{', '.join(GRAMMAR_SYNTAXES)}.",
                param="syntax",
            )
        if syntax == "regex":
            return cls.regex(definition)
        if not isinstance(definition, str) or not definition.strip():
            raise ConstraintError("A grammar must be a non-empty string (Lark syntax).")
        from gclm.compiler.front.grammar import check_grammar  # the grammar package imports this

        check_grammar(definition)  # a grammar that does not read is refused here, not compiled
        return cls("grammar", definition)

    @classmethod
    def choice(cls, choices: list[str]) -> Constraint:
        if (
            not isinstance(choices, list | tuple)
            or not choices
            or not all(isinstance(c, str) for c in choices)
        ):
            raise ConstraintError("A choice constraint must be a non-empty list of strings.")
        return cls("choice", json.dumps(list(choices), ensure_ascii=False))

    def key_material(self) -> str:
        """Canonical text that identifies this constraint (for the cache key)."""
        key = [self.kind, self.spec, self.whitespace]
        if self.additional_properties != "declared":  # the default keeps its old keys
            key.append(self.additional_properties)
        if self.pushdown:
            key.append("pushdown")
            if self.calls:  # `spec` unrolls them: the stack serves these texts
                key += [self.calls_pattern, *self.calls]
        return json.dumps(key, ensure_ascii=False)

    def as_spec(self) -> dict[str, Any]:
        """This constraint as the dict parse_constraint reads back (the whitespace is passed
        beside it): what crosses to vLLM's engine core in `extra_args`."""
        if self.kind == "json_object":
            return {"type": "json_object"}
        if self.kind == "json_schema":
            spec: dict[str, Any] = {"json": json.loads(self.spec)}
            if self.additional_properties != "declared":
                spec[DISABLE_ADDITIONAL_KEY] = False
            return spec
        if self.kind == "choice":
            return {"choice": json.loads(self.spec)}
        return {self.kind: self.spec}  # regex, grammar


def canonical_json(value: Any) -> str:
    """Compact JSON. Not key-sorted: property order is part of a schema's meaning here."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def parse_constraint(
    spec: Mapping[str, Any] | Constraint,
    *,
    whitespace: str = DEFAULT_WHITESPACE,
    additional_properties: str = "declared",
) -> Constraint:
    """The one reader of constraint dicts, for the HTTP layer, the transformers adapter and
    the CLI alike.

    Accepts an OpenAI `response_format` (`{"type": "json_schema", "json_schema": {"name":
    ..., "schema": {...}}}` or `{"type": "json_object"}`), a structured-outputs dict with
    exactly one of `{"json": schema}`, `{"regex": pattern}`, `{"choice": [...]}`,
    `{"grammar": lark_text}`, or a Constraint (returned as is). `whitespace` applies to
    JSON constraints; `additional_properties` to JSON Schemas, unless a structured-outputs
    dict says `"disable_additional_properties": true` ("declared") or false ("spec").

    Raises:
        ConstraintError: anything else; its `param` is the key inside `spec` that is wrong
            (e.g. "json_schema.schema", "regex"), or None when `spec` as a whole is.
    """
    if isinstance(spec, Constraint):
        return spec
    if not isinstance(spec, Mapping):
        raise ConstraintError(
            f"A constraint must be a dict, got {type(spec).__name__}: pass a response_format "
            'such as {"type": "json_object"} or {"regex": "..."}.'
        )
    if "type" in spec:
        return _response_format(spec, whitespace, additional_properties)
    keys = [k for k in STRUCTURED_KEYS if spec.get(k) is not None]
    unknown = sorted(set(spec) - {*STRUCTURED_KEYS, DISABLE_ADDITIONAL_KEY})
    if unknown:
        raise ConstraintError(
            f"Unknown constraint key {quote(unknown[0])}: use exactly one of "
            f"{', '.join(STRUCTURED_KEYS)}.",
            param=unknown[0],
            code="unknown_parameter",
        )
    if len(keys) != 1:
        raise ConstraintError(
            f"A constraint needs exactly one of {', '.join(STRUCTURED_KEYS)}; got "
            f"{', '.join(keys) or 'none'}.",
            code="invalid_structured_outputs",
        )
    key = keys[0]
    value = spec[key]
    disable = spec.get(DISABLE_ADDITIONAL_KEY)
    if disable is not None:
        if not isinstance(disable, bool):
            raise ConstraintError(
                f"{DISABLE_ADDITIONAL_KEY} must be true or false.", param=DISABLE_ADDITIONAL_KEY
            )
        if key != "json":
            raise ConstraintError(
                f"{DISABLE_ADDITIONAL_KEY} applies to a JSON Schema (json), not to {key}.",
                param=DISABLE_ADDITIONAL_KEY,
            )
        additional_properties = "declared" if disable else "spec"
    try:
        if key == "json":
            return Constraint.json_schema(value, whitespace, additional_properties)
        if key == "regex":
            return Constraint.regex(value)
        if key == "grammar":
            return Constraint.grammar(value)
        return Constraint.choice(value)
    except ConstraintError as e:
        e.param = key
        raise


def _response_format(
    spec: Mapping[str, Any], whitespace: str, additional_properties: str
) -> Constraint:
    kind = spec["type"]
    if kind == "json_object":
        return Constraint.json_object(whitespace)
    if kind != "json_schema":
        raise ConstraintError(
            f"response_format type {quote(kind)} is not a constraint; use 'json_schema' or "
            "'json_object' (for free text, send no constraint).",
            param="type",
        )
    body = spec.get("json_schema")
    if not isinstance(body, Mapping) or body.get("schema") is None:
        raise ConstraintError(
            'response_format of type "json_schema" needs '
            '"json_schema": {"name": ..., "schema": {...}}.',
            param="json_schema.schema",
            code="missing_required_parameter",
        )
    try:
        return Constraint.json_schema(body["schema"], whitespace, additional_properties)
    except ConstraintError as e:
        e.param = "json_schema.schema"
        raise
