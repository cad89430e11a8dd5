"""API keys: which routes a key protects, and each key's own limits.

With a key configured (`--api-key KEY`, or `--api-keys-file FILE` for several), every route
needs `Authorization: Bearer <key>` except /health (and /metrics with `--public-metrics on`,
for a scraper); /openapi.json included. A keys file has one key a line:

    sk-alice  name=alice  rpm=60  concurrent=4  tokens_per_minute=20000
    sk-batch  name=batch  compile_seconds_per_minute=30
    # a comment

`rpm`: requests a minute, `concurrent`: requests in flight at once; `tokens_per_minute`:
prompt plus completion tokens of the key's finished requests, `compile_seconds_per_minute`:
the compile time its requests caused (a table compiled for it, or a compile stopped at the
CPU limit; a cached one costs nothing).
Each "a minute" is a sliding 60 s window. Tokens and compile time are known only once spent,
so they are charged after the fact, and a key over either gets no new request until enough
of its window has passed. Past any limit the request gets a 429 with Retry-After.

Stored responses belong to the key that made them (`owner`: a digest of the key), and no
other key reads them.

Metrics count per key `name` (never the key itself): `gclm_key_requests_total{key, status}`,
`gclm_key_tokens_total{key}`, `gclm_key_compile_seconds_total{key}`.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gclm.errors import AuthenticationError, GclmError, KeyLimitError
from gclm.server.http.errors import error_response
from gclm.server.http.metrics import Metrics
from gclm.server.settings import ServerSettings

WINDOW_S = 60.0
# Keys-file option -> (ApiKey field, number type).
OPTIONS: dict[str, tuple[str, type]] = {
    "rpm": ("rpm", int),
    "concurrent": ("concurrent", int),
    "tokens_per_minute": ("tokens_per_minute", int),
    "compile_seconds_per_minute": ("compile_seconds_per_minute", float),
}


@dataclass
class Window:
    """Amounts charged in the last WINDOW_S seconds, oldest first, and their sum."""

    charges: deque[tuple[float, float]] = field(default_factory=deque)
    total: float = 0.0

    def add(self, now: float, amount: float) -> None:
        if amount > 0:
            self.charges.append((now, amount))
            self.total += amount

    def wait(self, now: float, limit: float | None) -> float | None:
        """None while the window's sum is under `limit`, else the seconds until it is."""
        while self.charges and now - self.charges[0][0] >= WINDOW_S:
            self.total -= self.charges.popleft()[1]
        if not self.charges:
            self.total = 0.0  # no float residue
        if limit is None or self.total < limit:
            return None
        left = self.total
        for started, amount in self.charges:
            left -= amount
            if left < limit:
                return started + WINDOW_S - now
        return WINDOW_S  # unreachable: the sum of no charges is under any limit >= 1


@dataclass
class ApiKey:
    """One key's name, limits (None: none) and the state its limits need."""

    token: str
    name: str
    rpm: int | None = None
    concurrent: int | None = None
    tokens_per_minute: int | None = None
    compile_seconds_per_minute: float | None = None
    in_flight: int = 0
    requests: Window = field(default_factory=Window)
    tokens: Window = field(default_factory=Window)
    compile_seconds: Window = field(default_factory=Window)

    def admit(self, now: float) -> GclmError | None:
        """None and the request counted, or the 429 saying when to retry."""
        for window, limit, what in (
            (self.requests, self.rpm, "requests"),
            (self.tokens, self.tokens_per_minute, "tokens"),
            (self.compile_seconds, self.compile_seconds_per_minute, "s of compile time"),
        ):
            wait = window.wait(now, limit)
            if wait is not None:
                return KeyLimitError(f"{limit:g} {what} a minute", wait)
        if self.concurrent is not None and self.in_flight >= self.concurrent:
            return KeyLimitError(f"{self.concurrent} requests at once", 1.0)
        self.requests.add(now, 1)
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
        name = f"key{number}"
        limits: dict[str, Any] = {}
        for option in options:
            option_name, sep, value = option.partition("=")
            if not sep or not value or option_name not in ("name", *OPTIONS):
                raise ValueError(
                    f"{path}:{number}: unknown option {option[:40]!r}; use name=, "
                    + ", ".join(f"{o}=" for o in OPTIONS)
                )
            if option_name == "name":
                name = value
                continue
            attribute, kind = OPTIONS[option_name]
            try:
                limits[attribute] = kind(value)
            except ValueError:
                number_kind = "an integer" if kind is int else "a number"
                raise ValueError(
                    f"{path}:{number}: {option_name} must be {number_kind}, not {value[:20]!r}"
                ) from None
            if kind is int and limits[attribute] < 1:
                raise ValueError(f"{path}:{number}: {option_name} must be at least 1")
            if not 0 < limits[attribute] < float("inf"):
                raise ValueError(f"{path}:{number}: {option_name} must be more than 0")
        keys.append(ApiKey(token, name, **limits))
    if not keys:
        raise ValueError(f"the API keys file {path} has no keys")
    return keys


class ApiKeys:
    """Pure ASGI middleware: a 401 without a known key, a 429 past the key's limits.

    A request let in carries its key's meter in `request.state` (see `charge`)."""

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
        scope.setdefault("state", {})[METER] = Meter(key, self.metrics)
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


METER = "gclm_key_meter"


@dataclass
class Meter:
    """What one request charges to its key's windows and metrics."""

    key: ApiKey
    metrics: Metrics

    def charge(self, tokens: int, compile_seconds: float) -> None:
        now = time.monotonic()
        self.key.tokens.add(now, tokens)
        self.key.compile_seconds.add(now, compile_seconds)
        if tokens:
            self.metrics.key_tokens.labels(key=self.key.name).inc(tokens)
        if compile_seconds:
            self.metrics.key_compile_seconds.labels(key=self.key.name).inc(compile_seconds)


def charge(request: Request, *, tokens: int = 0, compile_seconds: float = 0.0) -> None:
    """Charge what `request` used to its API key (nothing without keys)."""
    meter = request.scope.get("state", {}).get(METER)
    if meter is not None:
        meter.charge(tokens, compile_seconds)


def owner(request: Request) -> str:
    """Whose stored data the request may see: a digest of its API key (never the key itself),
    or "" on a server without keys. Stored responses are isolated by it
    (server/openai/responses/store.py)."""
    meter = request.scope.get("state", {}).get(METER)
    if meter is None:
        return ""
    return hashlib.sha256(meter.key.token.encode()).hexdigest()
