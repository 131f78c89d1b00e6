"""The world outside the demo's agent, kept apart from agentq's store.

* a payment service that deduplicates refunds by idempotency key, as real payment APIs do:
  a second request with a key it has seen returns the first refund and moves no money;
* the log of what happened, which the demo turns into its timeline;
* switches the demo arms to pause a worker at a chosen moment, once.

Two backends with one interface: a SQLite file (the embedded demo) and Redis keys under the
run's namespace (``agentq demo --redis``). Each worker process opens its own connections.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

import redis

_BUSY_TIMEOUT: Final = 10.0
_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT "
    "NULL, kind TEXT NOT NULL, data TEXT NOT NULL)",
    'CREATE TABLE IF NOT EXISTS refunds ("key" TEXT PRIMARY KEY, data TEXT NOT NULL)',
    "CREATE TABLE IF NOT EXISTS switches (name TEXT PRIMARY KEY)",
)


@dataclass(frozen=True)
class Event:
    """Something that happened outside the store: ``seq`` orders events, ``at`` is a Unix
    time, ``data`` says who (``worker``: the pid of the worker's main process) and what."""

    seq: int
    at: float
    kind: str
    data: dict[str, Any]


@dataclass(frozen=True)
class Refund:
    key: str
    order: str
    cents: int
    refund_id: str
    at: float


def refund_id_for(key: str) -> str:
    """The payment service names a refund after its idempotency key, so a retried request
    gets the same id back."""
    return "re_" + hashlib.sha256(key.encode()).hexdigest()[:12]


class Ledger(ABC):
    @abstractmethod
    def record(self, kind: str, **data: Any) -> None:
        """Append an event to the log."""

    @abstractmethod
    def events_after(self, seq: int) -> list[Event]:
        """The events logged after ``seq`` (0: all), in order."""

    @abstractmethod
    def refund(self, key: str, order: str, cents: int) -> tuple[Refund, bool]:
        """Refund ``cents`` on ``order`` unless ``key`` was seen: the refund under ``key``
        and whether this call issued it (``False``: a duplicate request, no money moved)."""

    @abstractmethod
    def refunds(self) -> list[Refund]:
        """Every refund issued."""

    @abstractmethod
    def arm(self, switch: str) -> None:
        """Set ``switch``; the first :meth:`take` of it answers ``True``."""

    @abstractmethod
    def take(self, switch: str) -> bool:
        """Whether ``switch`` was armed, disarming it (atomic: one taker only)."""

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _event(seq: int, payload: str | bytes) -> Event:
    fields = json.loads(payload)
    return Event(seq, fields.pop("at"), fields.pop("kind"), fields)


def _refund(key: str | bytes, payload: str | bytes | None) -> Refund:
    assert payload is not None, "a refund is read only after it was stored"
    key = key.decode() if isinstance(key, bytes) else key
    fields = json.loads(payload)
    return Refund(key, fields["order"], fields["cents"], fields["refund_id"], fields["at"])


def _refund_payload(key: str, order: str, cents: int) -> str:
    return json.dumps(
        {"order": order, "cents": cents, "refund_id": refund_id_for(key), "at": time.time()}
    )


class SQLiteLedger(Ledger):
    def __init__(self, path: str) -> None:
        self.path = path
        with self._db() as db:
            db.execute("PRAGMA journal_mode=WAL")
            for statement in _SCHEMA:
                db.execute(statement)

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        # A connection per call: cheap for a demo, and never shared across a fork.
        db = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT, isolation_level=None)
        try:
            yield db
        finally:
            db.close()

    def record(self, kind: str, **data: Any) -> None:
        with self._db() as db:
            db.execute(
                "INSERT INTO events (at, kind, data) VALUES (?, ?, ?)",
                (time.time(), kind, json.dumps(data)),
            )

    def events_after(self, seq: int) -> list[Event]:
        with self._db() as db:
            rows = db.execute(
                "SELECT seq, at, kind, data FROM events WHERE seq > ? ORDER BY seq", (seq,)
            ).fetchall()
        return [Event(row[0], row[1], row[2], json.loads(row[3])) for row in rows]

    def refund(self, key: str, order: str, cents: int) -> tuple[Refund, bool]:
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            issued = (
                db.execute(
                    'INSERT OR IGNORE INTO refunds ("key", data) VALUES (?, ?)',
                    (key, _refund_payload(key, order, cents)),
                ).rowcount
                == 1
            )
            (payload,) = db.execute('SELECT data FROM refunds WHERE "key" = ?', (key,)).fetchone()
            db.execute("COMMIT")
        return _refund(key, payload), issued

    def refunds(self) -> list[Refund]:
        with self._db() as db:
            rows = db.execute('SELECT "key", data FROM refunds ORDER BY "key"').fetchall()
        return [_refund(key, payload) for key, payload in rows]

    def arm(self, switch: str) -> None:
        with self._db() as db:
            db.execute("INSERT OR IGNORE INTO switches (name) VALUES (?)", (switch,))

    def take(self, switch: str) -> bool:
        with self._db() as db:
            return db.execute("DELETE FROM switches WHERE name = ?", (switch,)).rowcount == 1

    def close(self) -> None:
        pass


class RedisLedger(Ledger):
    def __init__(self, url: str, namespace: str) -> None:
        self.client = redis.Redis.from_url(url, decode_responses=True)
        self.ns = f"{namespace}:ledger:"

    def record(self, kind: str, **data: Any) -> None:
        self.client.rpush(self.ns + "events", json.dumps({**data, "at": time.time(), "kind": kind}))

    def events_after(self, seq: int) -> list[Event]:
        payloads = self.client.lrange(self.ns + "events", seq, -1)
        return [_event(seq + 1 + index, payload) for index, payload in enumerate(payloads)]

    def refund(self, key: str, order: str, cents: int) -> tuple[Refund, bool]:
        issued = bool(
            self.client.hsetnx(self.ns + "refunds", key, _refund_payload(key, order, cents))
        )
        return _refund(key, self.client.hget(self.ns + "refunds", key)), issued

    def refunds(self) -> list[Refund]:
        stored = self.client.hgetall(self.ns + "refunds")
        return [_refund(key, stored[key]) for key in sorted(stored)]

    def arm(self, switch: str) -> None:
        self.client.set(self.ns + "switch:" + switch, 1)

    def take(self, switch: str) -> bool:
        return bool(self.client.delete(self.ns + "switch:" + switch))

    def close(self) -> None:
        self.client.close()


def open_ledger(url: str, namespace: str) -> Ledger:
    """``url`` is a Redis URL or a path to the SQLite file."""
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisLedger(url, namespace)
    return SQLiteLedger(url)
