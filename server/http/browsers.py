"""What a web page can make a visitor's browser do with this server.

A page on any site can POST to `http://127.0.0.1:8000` from its visitors' browsers. Without a
CORS preflight a browser only sends "simple" requests: a body typed `text/plain`, form data,
or none. So:

- `RequireJson`: a POST body must be declared `application/json` (a 415 otherwise), which a
  browser sends cross-origin only after a preflight the server approves;
- CORS (Starlette's CORSMiddleware) is off unless `cors_origins` lists the origins allowed,
  so no preflight is approved by default;
- `HostAllowList`: with `allowed_hosts` set, a request whose Host header is not listed gets
  a 400 (a DNS-rebinding page reaches the server under its own host name).

`install_browser_guards` adds them, and the API keys between the first two.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from gclm.errors import GclmError, InvalidRequestError, UnsupportedMediaTypeError, quote
from gclm.server.http.errors import RejectionHook, error_response
from gclm.server.http.keys import ApiKey, ApiKeys
from gclm.server.http.metrics import Metrics
from gclm.server.settings import ServerSettings


def install_browser_guards(
    app: FastAPI,
    settings: ServerSettings,
    metrics: Metrics,
    keys: list[ApiKey],
    json_paths: frozenset[str],
) -> None:
    """Add the JSON requirement, the API keys (server/http/keys.py), CORS and the Host
    allow-list (when configured) to `app`, each outside the ones before it: a CORS preflight
    carries no key, and a key is checked before the body's type. `json_paths`: the routes
    whose POST body is read."""
    on_rejection = metrics.reject
    app.add_middleware(RequireJson, paths=json_paths, on_rejection=on_rejection)
    public = {"/health"} | ({"/metrics"} if settings.public_metrics_on else set())
    app.add_middleware(ApiKeys, keys=keys, metrics=metrics, public=public)
    if settings.cors_origin_list:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origin_list),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type"],
            expose_headers=["Retry-After", "retry-after-ms"],
            max_age=600,
        )
    if settings.allowed_host_list:
        app.add_middleware(
            HostAllowList, hosts=settings.allowed_host_list, on_rejection=on_rejection
        )


class _Guard:
    """Pure ASGI middleware refusing some HTTP requests with an OpenAI-shaped error."""

    def __init__(self, app: ASGIApp, on_rejection: RejectionHook | None = None) -> None:
        self.app = app
        self.on_rejection = on_rejection

    def refusal(self, scope: Scope) -> GclmError | None:
        raise NotImplementedError

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = self.refusal(scope) if scope["type"] == "http" else None
        if error is None:
            await self.app(scope, receive, send)
            return
        if self.on_rejection is not None:
            self.on_rejection(error.code or error.error_type)
        await error_response(error)(scope, receive, send)


class RequireJson(_Guard):
    """A 415 for a POST to one of `paths` whose body is not declared `application/json`
    (other methods and paths are the router's: 404, 405)."""

    def __init__(
        self, app: ASGIApp, paths: frozenset[str], on_rejection: RejectionHook | None = None
    ) -> None:
        super().__init__(app, on_rejection)
        self.paths = paths

    def refusal(self, scope: Scope) -> GclmError | None:
        if scope["method"] != "POST" or scope["path"] not in self.paths:
            return None
        declared = _header(scope, b"content-type")
        media_type = declared.split(";", 1)[0].strip().lower()
        return None if media_type == "application/json" else UnsupportedMediaTypeError(declared)


class HostAllowList(_Guard):
    """A 400 for a request whose Host header (port aside) is not in `hosts`."""

    def __init__(
        self, app: ASGIApp, hosts: tuple[str, ...], on_rejection: RejectionHook | None = None
    ) -> None:
        super().__init__(app, on_rejection)
        self.hosts = frozenset(h.lower() for h in hosts)

    def refusal(self, scope: Scope) -> GclmError | None:
        host = _header(scope, b"host")
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if "*" in self.hosts or name.lower() in self.hosts:
            return None
        return InvalidRequestError(
            f"This server does not answer to the host {quote(host)}. Use one of its names "
            "(--allowed-hosts lists them).",
            param=None,
            code="invalid_host",
        )


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return ""
