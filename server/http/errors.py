"""The one place where errors become OpenAI-shaped HTTP responses.

Every error response (and every error event inside a stream) has the body

    {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}

that the openai SDK turns into `BadRequestError`, `AuthenticationError`, `RateLimitError`...
Sources: `GclmError` (status and type from the class), pydantic validation errors (400,
`param` names the field), Starlette's 404/405, and anything else (500, details logged, not
sent). A client that hangs up while sending its body is no error of anyone's: one log line,
a disconnect counted, and a 499 in /metrics.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from gclm.errors import (
    QUOTE_LIMIT,
    GclmError,
    InternalError,
    InvalidRequestError,
    quote,
)

logger = logging.getLogger("gclm.server")

# pydantic-core's JSON parser follows at most this many nested objects and arrays.
JSON_DEPTH_LIMIT = 200

# Not an HTTP status anyone reads (the client has gone); nginx's "client closed request",
# so that /metrics tells disconnects apart from answers.
CLIENT_CLOSED = 499

# Called with a short reason ("queue_full", "budget_too_small", ...) for each rejection.
RejectionHook = Callable[[str], None]


def error_body(
    message: str, error_type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The OpenAI error object, as sent in a response body or an SSE `data:` line."""
    if param is not None and len(param) > QUOTE_LIMIT:  # a 100 KB unknown key is no name
        param = param[: QUOTE_LIMIT - 3] + "..."
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def as_gclm_error(exc: BaseException, *, log: bool = True) -> GclmError:
    """`exc` itself if it is a GclmError; otherwise a generic InternalError.

    The details of a non-gclm error go to the log (when `log`), never to the client.
    """
    if isinstance(exc, GclmError):
        return exc
    if log:
        logger.error("unexpected error", exc_info=exc)
    return InternalError(
        "The server hit an unexpected error; see its log for details.", code="internal_error"
    )


def gclm_error_body(exc: BaseException) -> dict[str, Any]:
    """The error object for any exception (non-gclm ones become a generic server error)."""
    err = as_gclm_error(exc)
    return error_body(err.message, err.error_type, err.param, err.code)


def error_response(exc: GclmError) -> JSONResponse:
    """The HTTP response for a GclmError; one that clears by waiting (a full queue, a key's
    limit, the connection cap) also gets retry headers."""
    headers: dict[str, str] = {}
    if exc.retry_after is not None:
        # Retry-After must be whole seconds; the openai SDK prefers the precise retry-after-ms.
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
        headers["retry-after-ms"] = str(int(exc.retry_after * 1000))
    return JSONResponse(gclm_error_body(exc), status_code=exc.status_code, headers=headers)


def validation_error(exc: ValidationError | RequestValidationError) -> InvalidRequestError:
    """A 400 for the first problem pydantic found, with `param` naming the field."""
    errors = exc.errors()
    if not errors:
        return InvalidRequestError("The request body is invalid.", param=None)
    first = errors[0]
    loc = [part for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        detail = first.get("ctx", {}).get("error", first.get("msg", ""))
        if "recursion limit" in detail:
            # Valid JSON, just deeper than the parser follows: say that, not "not valid JSON".
            return InvalidRequestError(
                f"The request body nests objects or arrays more than {JSON_DEPTH_LIMIT} levels "
                f"deep ({detail}). Flatten it: a JSON Schema can name repeated parts in $defs "
                "and point to them with $ref.",
                param=None,
                code="too_deeply_nested",
            )
        return InvalidRequestError(
            f"The request body is not valid JSON ({detail}). Send a JSON object.",
            param=None,
            code="invalid_json",
        )
    param = _param_path(loc) or None
    kind = first.get("type", "")
    if kind == "missing":
        return InvalidRequestError(
            f"Missing required parameter: {quote(param)}.",
            param=param,
            code="missing_required_parameter",
        )
    if kind == "extra_forbidden":
        return InvalidRequestError(
            f"Unrecognized request argument supplied: {quote(param)}. gclm does not implement it; "
            "remove it from the request.",
            param=param,
            code="unknown_parameter",
        )
    message = str(first.get("msg", "invalid value"))
    # Our own validators raise ValueError; pydantic prefixes their text with "Value error, ".
    message = message.removeprefix("Value error, ")
    if param is None:
        return InvalidRequestError(f"Invalid request body: {message}.", param=None)
    return InvalidRequestError(f"Invalid value for {quote(param)}: {message}.", param=param)


def _param_path(loc: list[Any]) -> str:
    """("messages", 0, "content") -> "messages[0].content", as OpenAI spells params."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def install_error_handlers(
    app: FastAPI,
    on_rejection: RejectionHook | None = None,
    on_disconnect: Callable[[], None] | None = None,
) -> None:
    """Route every error raised while handling a request through `error_response`;
    `on_disconnect` is called for a client that left while sending its request."""

    def reject(exc: GclmError) -> JSONResponse:
        if on_rejection is not None:
            on_rejection(exc.code or exc.error_type)
        return error_response(exc)

    async def on_request_error(_: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, ValidationError | RequestValidationError):
            exc = validation_error(exc)
        if not isinstance(exc, GclmError):  # not reachable: registered for these types only
            raise exc
        return reject(exc)

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        status = getattr(exc, "status_code", 500)  # registered for Starlette's HTTPException
        if status == 404:
            message = f"Unknown request URL: {request.method} {request.url.path}."
            code = "unknown_url"
        elif status == 405:
            message = f"Method {request.method} is not allowed on {request.url.path}."
            code = "method_not_allowed"
        else:
            message, code = str(getattr(exc, "detail", exc)), None
        body = error_body(message, "invalid_request_error", None, code)
        headers = getattr(exc, "headers", None)
        if status == 405:  # Starlette's names the methods of the first route on the path only
            headers = {**(headers or {}), "Allow": allowed_methods(request)}
        return JSONResponse(body, status_code=status, headers=headers)

    async def on_client_gone(request: Request, _: Exception) -> Response:
        client = f"{request.client.host}:{request.client.port}" if request.client else "?"
        logger.info(
            "client %s hung up while sending %s %s", client, request.method, request.url.path
        )
        if on_disconnect is not None:
            on_disconnect()
        return Response(status_code=CLIENT_CLOSED)

    async def on_unexpected(_: Request, exc: Exception) -> JSONResponse:
        # Starlette re-raises the exception after this response, and the ASGI server logs it.
        return error_response(as_gclm_error(exc, log=False))

    for kind in (GclmError, RequestValidationError, ValidationError):
        app.add_exception_handler(kind, on_request_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(ClientDisconnect, on_client_gone)
    app.add_exception_handler(Exception, on_unexpected)


METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> str:
    """The methods some route answers on the request's path, for a 405's Allow header
    (Starlette's names the first route's only, and a path may have a route per method: GET
    and DELETE /v1/responses/{id})."""
    return ", ".join(
        method
        for method in METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] == Match.FULL
            for route in request.app.router.routes
        )
    )
