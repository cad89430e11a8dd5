"""The JSON Schema front end: a schema -> a subset outlines-core compiles faithfully -> regex.

- normalize.py: one pass over a schema (refs, allOf/anyOf/oneOf/not, types, bounds) into
  nodes, recording every rewrite that narrows what is generated; refuses what it cannot honour.
- objects.py, refs.py, proofs.py, finish.py, ops.py: the object keywords, `$ref` resolution,
  proofs that a keyword is redundant, the final outlines-core form, and the node algebra.
- exclusions.py, prefixes.py: objects narrowed until they fail a `not` or the other `oneOf`
  branches, and the first characters of strings (proofs that two string schemas are disjoint).
- numbers.py, patterns.py: regexes for the leaves (bounded numbers, patterns, formats).
- regex.py: the normalised schema -> outlines-core's regex, with those leaves spliced in.
"""

from gclm.compiler.front.json_schema.normalize import SchemaLimits, normalize_schema
from gclm.compiler.front.json_schema.regex import JSON_OBJECT_DEPTH, json_object_regex, schema_regex

__all__ = [
    "JSON_OBJECT_DEPTH",
    "SchemaLimits",
    "json_object_regex",
    "normalize_schema",
    "schema_regex",
]
