"""Stored responses: the Responses API's `store`, kept in an embedded SQLite database.

    store = ResponseStore.open(settings)            # None with --responses-db off
    store.put(owner, body, context)                 # a whole response, in one transaction
    stored = store.get(owner, response_id)          # None: unknown, expired, or another key's
    store.delete(owner, response_id)

A row is one response: its object as the client got it (`body`) and every input item the
model read before it (`context`: the earlier turns' inputs and outputs, then this request's
input), so a turn chained with `previous_response_id` needs one row, whatever was deleted
or expired before it. A response is written once, whole, when its answer is complete: one
under way is not in the database (a GET answers 404 until then), and a crash mid-answer
leaves nothing half-written. The owner is a digest of the request's API key (the empty
string without keys): every query names it, so one key never reads another's responses.

Every call blocks (SQLite's file I/O): the router runs them in worker threads, each thread
on its own connection. The database is in WAL mode (readers do not wait for the writer) with
`synchronous=FULL`, so what was committed survives a crash or a restart. Rows past the
retention are never returned, and are deleted at most once a minute by the next write.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gclm.server.settings import ServerSettings, sqlite_path

SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    owner TEXT NOT NULL,
    id TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    body TEXT NOT NULL,
    context TEXT NOT NULL,
    PRIMARY KEY (owner, id)
);
CREATE INDEX IF NOT EXISTS responses_expiry ON responses (expires_at);
"""
PURGE_EVERY_S = 60.0
BUSY_TIMEOUT_S = 30.0  # a writer waits this long for another's transaction (other servers')


@dataclass(frozen=True)
class StoredResponse:
    """One stored response: its object as sent, and the input items the model read."""

    body: dict[str, Any]
    context: list[dict[str, Any]]  # earlier turns first, this request's input last
    size: int  # bytes of JSON stored for it

    @property
    def output(self) -> list[dict[str, Any]]:
        output: list[dict[str, Any]] = self.body.get("output", [])
        return output


class ResponseStore:
    """The stored responses of one database file; safe to call from any thread."""

    def __init__(self, path: Path, retention_s: float, max_bytes: int) -> None:
        self.path = path
        self.retention_s = retention_s
        self.max_bytes = max_bytes  # of a conversation stored under one response (the router's)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[sqlite3.Connection] = []
        self._purged = 0.0

    @classmethod
    def open(cls, settings: ServerSettings) -> ResponseStore | None:
        """The server's store (None with `--responses-db off`). The file is created on first
        use, so a server that stores nothing writes nothing."""
        url = settings.responses_db
        if url == "off":
            return None
        path = settings.cache_dir / "responses.db" if url is None else sqlite_path(url)
        days = settings.responses_retention
        return cls(path, days * 86400.0, settings.responses_max_size << 20)

    def _db(self) -> sqlite3.Connection:
        """This thread's connection, opened (and the schema made) on first use."""
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: transactions are the explicit BEGIN ... COMMIT below.
            db = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
            db.execute("PRAGMA synchronous=FULL")
            with self._lock:
                if not self._connections:
                    _set_up(db)
                self._connections.append(db)
            self._local.db = db
        return db

    def put(self, owner: str, body: dict[str, Any], context: list[dict[str, Any]]) -> None:
        """Store a whole response (one transaction); expired rows are purged now and then."""
        now = time.time()
        db = self._db()
        with _immediate(db):
            db.execute(
                "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?)",
                (
                    owner,
                    body["id"],
                    now,
                    now + self.retention_s,
                    json.dumps(body, separators=(",", ":")),
                    json.dumps(context, separators=(",", ":")),
                ),
            )
            if now - self._purged >= PURGE_EVERY_S:
                self._purged = now
                db.execute("DELETE FROM responses WHERE expires_at <= ?", (now,))

    def get(self, owner: str, response_id: str) -> StoredResponse | None:
        """The response `response_id` of `owner`, unless unknown, expired or deleted."""
        row = (
            self._db()
            .execute(
                "SELECT body, context FROM responses WHERE owner = ? AND id = ? AND expires_at > ?",
                (owner, response_id, time.time()),
            )
            .fetchone()
        )
        if row is None:
            return None
        return StoredResponse(json.loads(row[0]), json.loads(row[1]), len(row[0]) + len(row[1]))

    def delete(self, owner: str, response_id: str) -> bool:
        """Delete `owner`'s response; False when there was none to delete."""
        deleted = (
            self._db()
            .execute(
                "DELETE FROM responses WHERE owner = ? AND id = ? AND expires_at > ?",
                (owner, response_id, time.time()),
            )
            .rowcount
        )
        return deleted > 0

    def close(self) -> None:
        """Close every thread's connection (at shutdown)."""
        with self._lock:
            connections, self._connections = self._connections, []
        for db in connections:
            db.close()


def _set_up(db: sqlite3.Connection) -> None:
    """Put the file in WAL mode and make the schema, once per process, racing other servers.

    Switching the journal mode takes the file whole, and SQLite answers "database is locked"
    at once (not after its busy timeout) while another connection is opening or setting it
    up: that is retried here, up to the same timeout. The schema is made in an IMMEDIATE
    transaction, which waits its turn for the write lock instead of failing to upgrade."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    with _immediate(db):
        for statement in SCHEMA.split(";"):
            if statement.strip():
                db.execute(statement)


@contextmanager
def _immediate(db: sqlite3.Connection) -> Iterator[None]:
    """One IMMEDIATE transaction (it takes the write lock first, waiting its turn up to the
    busy timeout): committed whole, or rolled back whole on any error."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
