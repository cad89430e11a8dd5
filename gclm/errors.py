"""Every error gclm raises on purpose, in one tree.

    GclmError                      400 invalid_request_error (base; never raised bare)
    ├── ConstraintError            400  the constraint itself is wrong or unsupported
    │   ├── UnsupportedSchemaError 400  a schema keyword gclm cannot honour (has a JSON pointer)
    │   └── CompileLimitError      400  compiling ran past the time, memory or state limit
    ├── BudgetTooSmallError        400  max_tokens is below the constraint's minimum
    ├── InvalidRequestError        400  a request parameter is invalid, conflicting or unsupported
    ├── ModelNotFoundError         404  the request names a model this server does not serve
    ├── ResponseNotFoundError      404  no stored response has that id for this API key
    ├── AuthenticationError        401
    ├── QueueFullError             429  (with retry_after seconds)
    │   ├── CompilerBusyError      429  the compile queue is full, or a compile waited too long
    │   └── KeyLimitError          429  an API key is past its own requests/minute or in flight
    ├── RequestTooLargeError       413  the request body is over the server's size limit
    ├── UnsupportedMediaTypeError  415  a request body that is not application/json
    ├── TooManyConnectionsError    503  the server holds --max-connections open (Retry-After)
    ├── ModelLoadError             500  the model or tokenizer could not be loaded
    ├── InternalError              500  an invariant broke (an empty mask, a disallowed token)
    ├── ResponseStoreError         503  the stored responses' database failed (disk, lock)
    └── EngineDeadError            503  the engine stopped for good; GET /health says so too

Each message says what was wrong and how to fix it. `server/http/errors.py` turns these
into OpenAI-shaped HTTP errors; the CLI prints `message` on one line. A ConstraintError's
`param` is where in the constraint the problem is (None: the whole); the HTTP layer prefixes
it with the request field the constraint came from.
"""

from __future__ import annotations

from typing import Any

# Values quoted in messages are cut to this many characters: a refusal must not echo a 1 MB
# `tools` array back to the client.
QUOTE_LIMIT = 80
# No message is longer than this (a net under every quote: what a message echoes is cut in
# the middle, so its start and its advice on the fix at the end both stay).
MESSAGE_LIMIT = 2048


def cut(text: str, limit: int = QUOTE_LIMIT) -> str:
    """`text` cut to `limit` characters with an ellipsis, for an error message."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def quote(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """`repr(value)`, cut to `limit` characters with an ellipsis, for an error message."""
    return cut(repr(value), limit)


def _bounded(message: str) -> str:
    if len(message) <= MESSAGE_LIMIT:
        return message
    head = MESSAGE_LIMIT * 2 // 3
    return message[:head] + " [...] " + message[len(message) - (MESSAGE_LIMIT - head - 7) :]


class GclmError(Exception):
    """Base class. Subclasses fix the HTTP status and OpenAI error type."""

    status_code = 400
    error_type = "invalid_request_error"
    # Seconds after which the request may succeed: the answer gets Retry-After (None: none).
    retry_after: float | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        message = _bounded(message)
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class ConstraintError(GclmError):
    """The constraint (schema, regex, choices) is invalid or cannot be compiled."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = "invalid_constraint",
    ):
        super().__init__(message, param=param, code=code)


class UnsupportedSchemaError(ConstraintError):
    """A JSON Schema keyword that gclm cannot honour, at a JSON pointer."""

    def __init__(self, keyword: str, pointer: str, detail: str = ""):
        where = cut(pointer or "/")
        text = f"JSON Schema keyword {quote(keyword)} at {where} is not supported"
        text += f": {detail}" if detail else ""
        text += ". Remove it or rewrite the schema without it."
        super().__init__(text, code="unsupported_schema")
        self.keyword = keyword
        self.pointer = where


class CompileLimitError(ConstraintError):
    """Compilation exceeded the time, memory or state limit; `compile_seconds`: the CPU
    time it used before it was stopped (0: not known)."""

    def __init__(self, message: str, compile_seconds: float = 0.0):
        super().__init__(message, code="compile_limit")
        self.compile_seconds = compile_seconds


class BudgetTooSmallError(GclmError):
    """The token budget is below the fewest tokens the constraint can be completed in."""

    def __init__(self, min_tokens: int, budget: int, param: str = "max_tokens"):
        super().__init__(
            f"{param}={budget} is too small for this constraint: the shortest valid output "
            f"needs {min_tokens} tokens. Set {param} to at least {min_tokens}.",
            param=param,
            code="budget_too_small",
        )
        self.min_tokens = min_tokens
        self.budget = budget


class InvalidRequestError(GclmError):
    """A request parameter is invalid, conflicting, or not supported by gclm (400)."""

    def __init__(self, message: str, *, param: str | None, code: str = "invalid_parameter"):
        super().__init__(message, param=param, code=code)


class ModelNotFoundError(GclmError):
    """The request names a model this server does not serve (404)."""

    status_code = 404

    def __init__(self, requested: str, served: str):
        super().__init__(
            f"The model {quote(requested)} does not exist on this server. It serves {served!r}; "
            "set model to that name (GET /v1/models lists it).",
            param="model",
            code="model_not_found",
        )


class ResponseNotFoundError(GclmError):
    """No stored response has this id for the request's API key: never stored, expired,
    deleted, or another key's (the message is the same for each, as OpenAI's) (404)."""

    status_code = 404

    def __init__(self, response_id: str, param: str | None = None):
        super().__init__(f"No response found with id '{cut(response_id)}'.", param=param)


class AuthenticationError(GclmError):
    status_code = 401
    error_type = "authentication_error"

    def __init__(
        self, message: str = "Missing or invalid API key. Send 'Authorization: Bearer <key>'."
    ):
        super().__init__(message, code="invalid_api_key")


class QueueFullError(GclmError):
    status_code = 429
    error_type = "rate_limit_error"

    def __init__(self, queue_size: int, retry_after: float = 1.0):
        super().__init__(
            f"The server's request queue is full ({queue_size} waiting). Retry after "
            f"{retry_after:g} s, or start the server with a larger --queue-size.",
            code="queue_full",
        )
        self.retry_after = retry_after


class CompilerBusyError(QueueFullError):
    """Compiles are queued past the compile queue's size, or one waited in the queue until
    its time was spent: both clear by waiting, so the answer is a 429 with Retry-After.

    Whether the compile goes on is the compile's business, not the error's: a request's
    answer from the compiler (compiler/service/compile_job.py's `Compiling`) holds the
    compile's own outcome beside it.
    """

    def __init__(self, message: str, retry_after: float = 1.0):
        GclmError.__init__(self, message, code="compiler_busy")
        self.retry_after = retry_after


class KeyLimitError(QueueFullError):
    """The request's API key is past one of its limits (server/http/keys.py)."""

    error_type = "rate_limit_error"

    def __init__(self, limit: str, retry_after: float):
        GclmError.__init__(
            self,
            f"This API key is limited to {limit}. Retry after {retry_after:.0f} s, or ask the "
            "server's operator for a higher limit.",
            code="rate_limit_exceeded",
        )
        self.retry_after = retry_after


class RequestTooLargeError(GclmError):
    """The request body is larger than the server accepts (413)."""

    status_code = 413

    def __init__(self, limit_bytes: int):
        super().__init__(
            f"The request body is larger than this server's limit of {_size(limit_bytes)}. "
            "Send a smaller request, or start the server with a larger --max-body-size.",
            code="request_too_large",
        )
        self.limit_bytes = limit_bytes


class UnsupportedMediaTypeError(GclmError):
    """A request body not declared `Content-Type: application/json` (415)."""

    status_code = 415

    def __init__(self, content_type: str):
        declared = f"Content-Type {quote(content_type)}" if content_type else "no Content-Type"
        super().__init__(
            f"The request body must be JSON sent with 'Content-Type: application/json'; this "
            f"request has {declared}.",
            code="unsupported_media_type",
        )


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n:,} bytes"


class ModelLoadError(GclmError):
    status_code = 500
    error_type = "server_error"


class InternalError(GclmError):
    """An invariant of the masking or the engine broke: a bug in gclm, not in the request."""

    status_code = 500
    error_type = "server_error"


class ResponseStoreError(GclmError):
    """The stored responses' database failed to read or write (a full disk, a lock held past
    its timeout): the request may succeed later (503)."""

    status_code = 503
    error_type = "server_error"
    retry_after = 1.0


class TooManyConnectionsError(GclmError):
    """The server holds its --max-connections open connections (server/http/connections.py):
    a 503 that clears as other clients finish."""

    status_code = 503
    error_type = "server_error"

    def __init__(self, limit: int, retry_after: float = 1.0):
        super().__init__(
            f"The server is at its limit of {limit} open connections. Retry after "
            f"{retry_after:g} s, or start the server with a larger --max-connections.",
            code="too_many_connections",
        )
        self.retry_after = retry_after


class EngineDeadError(GclmError):
    """The engine (its thread, or vLLM's engine core) has stopped and serves no more: every
    request gets a 503 and GET /health fails with this message, so that a supervisor
    restarts the server."""

    status_code = 503
    error_type = "server_error"

    def __init__(self, reason: str):
        super().__init__(
            f"The inference engine died and serves no more requests ({reason}). The server "
            "must be restarted; its log has the cause.",
            code="engine_dead",
        )
        self.reason = reason
