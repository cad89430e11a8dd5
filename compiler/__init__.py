"""The compiler: a constraint -> the tables that mask a vocabulary's tokens, in stages.

Read the folders in order:

- front/: what a request asks for (a Constraint) written as one regex: JSON Schema
  (json_schema/), Lark grammars (grammar/), users' regexes, choices.
- vocab/: the tokenizer's tokens as bytes, and as a byte trie.
- whole/: outlines-core's whole byte DFA walked by every token into a CompiledTable
  (the compile workers' path).
- grown/: our regex -> NFA -> byte DFA grown where walks go -> LazyTable (the server's
  first masks, budget exact).
- service/: the table cache, the worker pool and the first-mask service.

This face is what the other packages (masking/, server/) import. Each name is loaded when
it is first read, so that importing `gclm.compiler` brings neither numba nor outlines-core
(vLLM's processes read whole tables and never load the grown path).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gclm.compiler.front.constraint import (
        ADDITIONAL_PROPERTIES,
        DEFAULT_WHITESPACE,
        STRUCTURED_KEYS,
        Constraint,
        parse_constraint,
    )
    from gclm.compiler.front.deadline import OutOfTime, work_deadline
    from gclm.compiler.front.grammar import grammar_regex
    from gclm.compiler.front.grammar.frames import recursive_rules
    from gclm.compiler.front.json_schema.calls import call_char
    from gclm.compiler.front.json_schema.normalize import SchemaLimits, normalize_schema
    from gclm.compiler.front.json_schema.patterns import escape_literal
    from gclm.compiler.front.json_schema.regex import schema_regex
    from gclm.compiler.front.regex import json_regex
    from gclm.compiler.front.rust_regex import check_regex, matches_empty, strip_anchors
    from gclm.compiler.grown.lazy_table import LazyTable, SearchTooLarge, request_deadline
    from gclm.compiler.grown.substrings import grammar_holds
    from gclm.compiler.numba_cache import cache_per_version
    from gclm.compiler.service.cache import TableCache, cache_key
    from gclm.compiler.service.compile_job import Compiling
    from gclm.compiler.service.first_mask import FirstMasks
    from gclm.compiler.service.first_tables import FirstTables
    from gclm.compiler.service.pool import START_TIMEOUT_S, CompilerPool
    from gclm.compiler.service.worker import CompileLimits
    from gclm.compiler.vocab.vocabulary import TokenVocabulary
    from gclm.compiler.whole.compile import compile_constraint
    from gclm.compiler.whole.tables import CompiledTable, scalars
    from gclm.compiler.whole.token_sets import TokenSets, words_for

# Each name of the face -> the module that defines it.
_FACE = {
    "ADDITIONAL_PROPERTIES": "front.constraint",
    "DEFAULT_WHITESPACE": "front.constraint",
    "STRUCTURED_KEYS": "front.constraint",
    "Constraint": "front.constraint",
    "parse_constraint": "front.constraint",
    "OutOfTime": "front.deadline",
    "work_deadline": "front.deadline",
    "grammar_regex": "front.grammar",
    "recursive_rules": "front.grammar.frames",
    "call_char": "front.json_schema.calls",
    "grammar_holds": "grown.substrings",
    "SchemaLimits": "front.json_schema.normalize",
    "normalize_schema": "front.json_schema.normalize",
    "escape_literal": "front.json_schema.patterns",
    "schema_regex": "front.json_schema.regex",
    "json_regex": "front.regex",
    "check_regex": "front.rust_regex",
    "matches_empty": "front.rust_regex",
    "strip_anchors": "front.rust_regex",
    "LazyTable": "grown.lazy_table",
    "SearchTooLarge": "grown.lazy_table",
    "request_deadline": "grown.lazy_table",
    "cache_per_version": "numba_cache",
    "TableCache": "service.cache",
    "Compiling": "service.compile_job",
    "cache_key": "service.cache",
    "FirstMasks": "service.first_mask",
    "FirstTables": "service.first_tables",
    "START_TIMEOUT_S": "service.pool",
    "CompilerPool": "service.pool",
    "CompileLimits": "service.worker",
    "TokenVocabulary": "vocab.vocabulary",
    "compile_constraint": "whole.compile",
    "CompiledTable": "whole.tables",
    "scalars": "whole.tables",
    "TokenSets": "whole.token_sets",
    "words_for": "whole.token_sets",
}

__all__ = [
    "ADDITIONAL_PROPERTIES",
    "CompileLimits",
    "Compiling",
    "CompiledTable",
    "CompilerPool",
    "Constraint",
    "DEFAULT_WHITESPACE",
    "FirstMasks",
    "FirstTables",
    "LazyTable",
    "OutOfTime",
    "START_TIMEOUT_S",
    "STRUCTURED_KEYS",
    "SchemaLimits",
    "SearchTooLarge",
    "TableCache",
    "TokenSets",
    "TokenVocabulary",
    "cache_key",
    "cache_per_version",
    "check_regex",
    "compile_constraint",
    "escape_literal",
    "grammar_holds",
    "grammar_regex",
    "call_char",
    "recursive_rules",
    "json_regex",
    "matches_empty",
    "normalize_schema",
    "parse_constraint",
    "request_deadline",
    "scalars",
    "schema_regex",
    "strip_anchors",
    "words_for",
    "work_deadline",
]


def __getattr__(name: str) -> Any:
    module = _FACE.get(name)
    if module is None:
        raise AttributeError(f"module 'gclm.compiler' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"gclm.compiler.{module}"), name)
    globals()[name] = value  # read once; later reads are plain attribute reads
    return value
