"""API keys: which routes a key protects, and each key's own limits.

With a key configured (`--api-key KEY`, or `--api-keys-file FILE` for several), every route
needs `Authorization: Bearer <key>` except /health (and /metrics with `--public-metrics on`,
for a scraper); /docs, /redoc and /openapi.json included. A keys file has one key a line:

    sk-alice  name=alice  rpm=60  concurrent=4
    sk-batch  name=batch
    # a comment

`rpm`: requests a minute (a sliding 60 s window), `concurrent`: requests in flight at once;
past either the request gets a 429 with Retry-After. Metrics count requests per key `name`
(never the key itself): `gclm_key_requests_total{key, status}`.
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gclm.errors import AuthenticationError, GclmError, KeyLimitError
from gclm.server.http.errors import error_response
from gclm.server.http.metrics import Metrics
from gclm.server.settings import ServerSettings

WINDOW_S = 60.0


@dataclass
class ApiKey:
    """One key's name, limits (None: none) and the state its limits need."""

    token: str
    name: str
    rpm: int | None = None
    concurrent: int | None = None
    in_flight: int = 0
    recent: deque[float] = field(default_factory=deque)  # start times in the last WINDOW_S

    def admit(self, now: float) -> GclmError | None:
        """None and the request counted, or the 429 saying when to retry."""
        while self.recent and now - self.recent[0] >= WINDOW_S:
            self.recent.popleft()
        if self.rpm is not None and len(self.recent) >= self.rpm:
            wait = self.recent[0] + WINDOW_S - now
            return KeyLimitError(f"{self.rpm} requests a minute", wait)
        if self.concurrent is not None and self.in_flight >= self.concurrent:
            return KeyLimitError(f"{self.concurrent} requests at once", 1.0)
        self.recent.append(now)
        self.in_flight += 1
        return None


def load_keys(settings: ServerSettings) -> list[ApiKey]:
    """The keys from --api-key and --api-keys-file (empty: no authentication).

    Raises ValueError naming the file and line of a malformed entry.
    """
    keys = [ApiKey(settings.api_key.strip(), "default")] if settings.api_key else []
    if settings.api_keys_file is not None:
        keys += _read_keys_file(Path(settings.api_keys_file))
    names = [k.name for k in keys]
    if len(set(names)) != len(names) or len({k.token for k in keys}) != len(keys):
        raise ValueError("API key names and keys must each be distinct.")
    return keys


def _read_keys_file(path: Path) -> list[ApiKey]:
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise ValueError(f"cannot read the API keys file {path}: {e.strerror}") from None
    keys = []
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        token, *options = words
        values: dict[str, str] = {}
        for option in options:
            name, sep, value = option.partition("=")
            if not sep or name not in ("name", "rpm", "concurrent") or not value:
                raise ValueError(
                    f"{path}:{number}: unknown option {option[:40]!r}; use name=, rpm=, concurrent="
                )
            values[name] = value
        try:
            limits = {k: int(values[k]) for k in ("rpm", "concurrent") if k in values}
        except ValueError:
            raise ValueError(f"{path}:{number}: rpm and concurrent must be integers") from None
        if any(v < 1 for v in limits.values()):
            raise ValueError(f"{path}:{number}: rpm and concurrent must be at least 1")
        name = values.get("name", f"key{number}")
        keys.append(ApiKey(token, name, rpm=limits.get("rpm"), concurrent=limits.get("concurrent")))
    if not keys:
        raise ValueError(f"the API keys file {path} has no keys")
    return keys


class ApiKeys:
    """Pure ASGI middleware: a 401 without a known key, a 429 past the key's limits."""

    def __init__(self, app: ASGIApp, keys: list[ApiKey], metrics: Metrics, public: set[str]):
        self.app = app
        self.keys = keys
        self.metrics = metrics
        self.public = frozenset(public)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or scope["path"] in self.public:
            await self.app(scope, receive, send)
            return
        key = self.find(scope)
        if key is None:
            await self.refuse(AuthenticationError(), scope, receive, send)
            return
        error = key.admit(time.monotonic())
        if error is not None:
            self.metrics.key_requests.labels(key=key.name, status=str(error.status_code)).inc()
            await self.refuse(error, scope, receive, send)
            return
        status = 500

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            key.in_flight -= 1
            self.metrics.key_requests.labels(key=key.name, status=str(status)).inc()

    async def refuse(self, error: GclmError, scope: Scope, receive: Receive, send: Send) -> None:
        self.metrics.reject(error.code or error.error_type)
        await error_response(error)(scope, receive, send)

    def find(self, scope: Scope) -> ApiKey | None:
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), b"")
        scheme, _, token = header.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer":
            return None
        given = token.strip().encode()
        found = None
        for key in self.keys:  # all compared: the time taken says nothing of which matched
            if secrets.compare_digest(given, key.token.encode()):
                found = key
        return found
