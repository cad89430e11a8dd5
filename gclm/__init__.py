"""gclm: constrained generation whose outputs are valid and complete within max_tokens.

The public API, importable from here:

    from gclm import Constraint, create_constraint, GclmError

- `Constraint`: a JSON Schema, any JSON object, a regex or a choice of strings.
- `create_constraint(tokenizer, constraint, max_new_tokens)`: a LogitsProcessor plus a
  StoppingCriteria for Hugging Face `model.generate()` (imports transformers when called).
- `compile_constraint(constraint, vocab)`: the compiled table, in this process.
- `parse_constraint(spec)`: a response_format or structured-outputs dict as a Constraint.
- `load_model()`: the embedded SmolLM2-135M-Instruct (or a hub id / directory) and its
  tokenizer.
- The error tree (`gclm.errors`); every error gclm raises on purpose is a `GclmError`.

Subpackages: `gclm.compiler` (constraint -> tables), `gclm.masking` (tables + state +
budget -> logits masks, and the transformers adapter), `gclm.server` (HTTP, engine, model).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gclm.errors import (
    AuthenticationError,
    BudgetTooSmallError,
    CompileLimitError,
    CompilerBusyError,
    ConstraintError,
    EngineDeadError,
    GclmError,
    InternalError,
    InvalidRequestError,
    KeyLimitError,
    ModelLoadError,
    ModelNotFoundError,
    QueueFullError,
    RequestTooLargeError,
    ResponseNotFoundError,
    ResponseStoreError,
    TooManyConnectionsError,
    UnsupportedMediaTypeError,
    UnsupportedSchemaError,
)

if TYPE_CHECKING:
    from gclm.compiler import Constraint, compile_constraint, parse_constraint
    from gclm.masking.hf import HFConstraint, create_constraint
    from gclm.server.engine.model_loader import load_model

__all__ = [
    "AuthenticationError",
    "BudgetTooSmallError",
    "CompileLimitError",
    "CompilerBusyError",
    "Constraint",
    "ConstraintError",
    "EngineDeadError",
    "GclmError",
    "HFConstraint",
    "InternalError",
    "InvalidRequestError",
    "KeyLimitError",
    "ModelLoadError",
    "ModelNotFoundError",
    "QueueFullError",
    "RequestTooLargeError",
    "ResponseNotFoundError",
    "ResponseStoreError",
    "TooManyConnectionsError",
    "UnsupportedMediaTypeError",
    "UnsupportedSchemaError",
    "compile_constraint",
    "create_constraint",
    "load_model",
    "parse_constraint",
]

# Imported on first use: `import gclm` must not pull in torch, transformers or numba.
_LAZY = {
    "Constraint": "gclm.compiler.front.constraint",
    "parse_constraint": "gclm.compiler.front.constraint",
    "load_model": "gclm.server.engine.model_loader",
    "compile_constraint": "gclm.compiler.whole.compile",
    "HFConstraint": "gclm.masking.hf",
    "create_constraint": "gclm.masking.hf",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gclm' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
