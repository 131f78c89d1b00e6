"""The saver's backend in the agentq SQLite file: three tables beside agentq's own.

Each write is one ``BEGIN IMMEDIATE`` transaction that reads the thread's fence from
agentq's ``threads`` table and writes only if the writer may, so the check and the write
are one atomic step against every other process. A trigger deletes a thread's LangGraph
rows when agentq deletes (or expires) the thread, in agentq's own transaction.
"""

from __future__ import annotations

import math
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

from agentq.errors import LeaseHeld, StaleToken, StoreConfigError, ThreadNotFound
from agentq.store.graph import Backend
from agentq.store.graph_records import Row, StoredCheckpoint, decode_refs
from agentq.store.sqlite.store import BUSY_TIMEOUT, SQLiteStore, immediate_transaction

_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS lg_checkpoints (thread_id TEXT NOT NULL, ns TEXT NOT NULL, "
    "checkpoint_id TEXT NOT NULL, run_id TEXT, record BLOB NOT NULL, refs BLOB NOT NULL, "
    "PRIMARY KEY (thread_id, ns, checkpoint_id))",
    "CREATE INDEX IF NOT EXISTS lg_checkpoints_run ON lg_checkpoints(run_id) "
    "WHERE run_id IS NOT NULL",
    "CREATE TABLE IF NOT EXISTS lg_blobs (thread_id TEXT NOT NULL, ns TEXT NOT NULL, "
    "field BLOB NOT NULL, value BLOB NOT NULL, PRIMARY KEY (thread_id, ns, field))",
    "CREATE TABLE IF NOT EXISTS lg_writes (thread_id TEXT NOT NULL, ns TEXT NOT NULL, "
    "checkpoint_id TEXT NOT NULL, field BLOB NOT NULL, value BLOB NOT NULL, "
    "PRIMARY KEY (thread_id, ns, checkpoint_id, field))",
    "CREATE TRIGGER IF NOT EXISTS lg_thread_deleted AFTER DELETE ON threads BEGIN "
    "DELETE FROM lg_checkpoints WHERE thread_id = OLD.thread_id; "
    "DELETE FROM lg_blobs WHERE thread_id = OLD.thread_id; "
    "DELETE FROM lg_writes WHERE thread_id = OLD.thread_id; END",
)


class SQLiteBackend(Backend):
    """Opens its own connection to the store's file (one per process, shared by threads
    under a lock, reopened after ``fork()`` like the store's)."""

    def __init__(self, store: SQLiteStore) -> None:
        self.path = store.path
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._db: sqlite3.Connection | None = None
        # Connections inherited through fork() stay referenced, never closed: closing one in
        # the child could run SQLite's last-connection cleanup on the parent's WAL.
        self._inherited: list[sqlite3.Connection] = []
        with self._locked():
            pass  # create the tables now, so a bad file fails at construction

    # -- plumbing -------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False
            )
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            with immediate_transaction(db):
                for statement in _SCHEMA:
                    db.execute(statement)
        except sqlite3.Error as exc:
            raise StoreConfigError(
                f"cannot keep LangGraph checkpoints in SQLite store {self.path!r} ({exc}); "
                "check that it is an agentq database this user may write"
            ) from exc
        return db

    @contextmanager
    def _locked(self) -> Iterator[sqlite3.Connection]:
        if self._pid != os.getpid():
            self._lock, self._pid = threading.Lock(), os.getpid()
            if self._db is not None:
                self._inherited.append(self._db)
            self._db = None
        with self._lock:
            if self._db is None:
                self._db = self._connect()
            yield self._db

    @contextmanager
    def _write(self, thread_id: str, token: int | None) -> Iterator[sqlite3.Connection]:
        with self._locked() as db, immediate_transaction(db):
            _check_fence(db, thread_id, token)
            yield db

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        # One deferred transaction: every statement of a read sees the same snapshot.
        with self._locked() as db:
            db.execute("BEGIN")
            try:
                yield db
            finally:
                db.execute("COMMIT")

    # -- writes ---------------------------------------------------------------------------

    def put(self, thread_id: str, ns: str, stored: StoredCheckpoint, token: int | None) -> None:
        with self._write(thread_id, token) as db:
            db.execute(
                "INSERT OR REPLACE INTO lg_checkpoints (thread_id, ns, checkpoint_id, run_id, "
                "record, refs) VALUES (?, ?, ?, ?, ?, ?)",
                (thread_id, ns, stored.checkpoint_id, stored.run_id, stored.record, stored.refs),
            )
            db.executemany(
                "INSERT OR REPLACE INTO lg_blobs (thread_id, ns, field, value) VALUES (?, ?, ?, ?)",
                [(thread_id, ns, f, v) for f, v in stored.blobs.items()],
            )

    def put_writes(
        self,
        thread_id: str,
        ns: str,
        checkpoint_id: str,
        writes: Sequence[tuple[bytes, bytes, bool]],
        token: int | None,
    ) -> None:
        with self._write(thread_id, token) as db:
            for field, value, replace in writes:
                verb = "REPLACE" if replace else "IGNORE"
                db.execute(
                    f"INSERT OR {verb} INTO lg_writes (thread_id, ns, checkpoint_id, field, "
                    "value) VALUES (?, ?, ?, ?, ?)",
                    (thread_id, ns, checkpoint_id, field, value),
                )

    # -- reads ----------------------------------------------------------------------------

    def get(self, thread_id: str, ns: str, checkpoint_id: str | None) -> Row | None:
        with self._read() as db:
            if checkpoint_id is None:
                found = db.execute(
                    "SELECT checkpoint_id, record, refs FROM lg_checkpoints WHERE thread_id = ? "
                    "AND ns = ? ORDER BY checkpoint_id DESC LIMIT 1",
                    (thread_id, ns),
                ).fetchone()
            else:
                found = db.execute(
                    "SELECT checkpoint_id, record, refs FROM lg_checkpoints WHERE thread_id = ? "
                    "AND ns = ? AND checkpoint_id = ?",
                    (thread_id, ns, checkpoint_id),
                ).fetchone()
            return None if found is None else _row(db, thread_id, ns, found)

    def page(self, thread_id: str, ns: str, *, before: str | None, limit: int) -> list[Row]:
        with self._read() as db:
            rows = db.execute(
                "SELECT checkpoint_id, record, refs FROM lg_checkpoints WHERE thread_id = ? "
                "AND ns = ? AND (? IS NULL OR checkpoint_id < ?) "
                "ORDER BY checkpoint_id DESC LIMIT ?",
                (thread_id, ns, before, before, limit),
            ).fetchall()
            return [_row(db, thread_id, ns, found) for found in rows]

    def namespaces(self, thread_id: str) -> list[str]:
        with self._locked() as db:
            rows = db.execute(
                "SELECT DISTINCT ns FROM lg_checkpoints WHERE thread_id = ? ORDER BY ns",
                (thread_id,),
            ).fetchall()
        return [row[0] for row in rows]

    def threads(self) -> list[str]:
        with self._locked() as db:
            rows = db.execute(
                "SELECT DISTINCT thread_id FROM lg_checkpoints ORDER BY thread_id"
            ).fetchall()
        return [row[0] for row in rows]

    # -- deleting and copying -------------------------------------------------------------

    def delete_thread(self, thread_id: str, token: int | None) -> None:
        with self._write(thread_id, token) as db:
            for table in ("lg_checkpoints", "lg_blobs", "lg_writes"):
                db.execute(f"DELETE FROM {table} WHERE thread_id = ?", (thread_id,))

    def delete_runs(self, run_ids: Sequence[str]) -> None:
        if not run_ids:
            return
        marks = ", ".join("?" * len(run_ids))
        with self._locked() as db:
            threads = [
                row[0]
                for row in db.execute(
                    f"SELECT DISTINCT thread_id FROM lg_checkpoints WHERE run_id IN ({marks})",
                    tuple(run_ids),
                ).fetchall()
            ]
        for thread_id in threads:
            with self._write(thread_id, None) as db:
                gone = db.execute(
                    f"SELECT ns, checkpoint_id FROM lg_checkpoints WHERE thread_id = ? AND "
                    f"run_id IN ({marks})",
                    (thread_id, *run_ids),
                ).fetchall()
                for ns, checkpoint_id in gone:
                    _drop(db, thread_id, ns, checkpoint_id)
                for ns in sorted({ns for ns, _ in gone}):
                    _collect_blobs(db, thread_id, ns)

    def keep_latest(self, thread_id: str) -> None:
        with self._write(thread_id, None) as db:
            stale = db.execute(
                "SELECT ns, checkpoint_id FROM lg_checkpoints c WHERE thread_id = ? AND "
                "checkpoint_id < (SELECT MAX(checkpoint_id) FROM lg_checkpoints WHERE "
                "thread_id = c.thread_id AND ns = c.ns)",
                (thread_id,),
            ).fetchall()
            for ns, checkpoint_id in stale:
                _drop(db, thread_id, ns, checkpoint_id)
            for ns in sorted({ns for ns, _ in stale}):
                _collect_blobs(db, thread_id, ns)

    def copy_thread(self, source: str, target: str) -> None:
        with self._write(target, None) as db:
            for table, columns in (
                ("lg_checkpoints", "ns, checkpoint_id, run_id, record, refs"),
                ("lg_blobs", "ns, field, value"),
                ("lg_writes", "ns, checkpoint_id, field, value"),
            ):
                db.execute(
                    f"INSERT OR REPLACE INTO {table} (thread_id, {columns}) "
                    f"SELECT ?, {columns} FROM {table} WHERE thread_id = ?",
                    (target, source),
                )

    def close(self) -> None:
        with self._lock:
            if self._db is not None and self._pid == os.getpid():
                self._db.close()
            self._db = None


def _check_fence(db: sqlite3.Connection, thread_id: str, token: int | None) -> None:
    found = db.execute(
        "SELECT fence, lock_owner, lock_expires FROM threads WHERE thread_id = ?", (thread_id,)
    ).fetchone()
    if token is None:
        expires = None if found is None or found[1] is None else found[2]
        if expires is not None and expires > time.time():
            ttl_ms = max(1, math.ceil((expires - time.time()) * 1000))
            raise LeaseHeld(
                f"a graph task drives this thread (lease for {ttl_ms} ms more), so a write "
                "from outside it would fork the checkpoint chain; wait until the thread is "
                "waiting or finished, or cancel it first",
                thread_id=thread_id,
                ttl_ms=ttl_ms,
            )
        return
    if found is None:
        raise ThreadNotFound(
            "a fenced LangGraph write names a thread agentq does not hold; start the thread "
            "through its graph task, or write without a token",
            thread_id=thread_id,
        )
    if found[0] != token:
        raise StaleToken(
            f"LangGraph write with fencing token {token} refused: the thread's current token "
            f"is {found[0]}, so another worker has taken the thread over; stop this run",
            thread_id=thread_id,
        )


def _row(db: sqlite3.Connection, thread_id: str, ns: str, found: Any) -> Row:
    checkpoint_id, record, refs = found
    fields = decode_refs(refs) if refs else []
    stored: dict[bytes, bytes] = {}
    if fields:
        marks = ", ".join("?" * len(fields))
        stored = {
            bytes(f): bytes(v)
            for f, v in db.execute(
                f"SELECT field, value FROM lg_blobs WHERE thread_id = ? AND ns = ? AND field IN "
                f"({marks})",
                (thread_id, ns, *fields),
            ).fetchall()
        }
    writes = db.execute(
        "SELECT field, value FROM lg_writes WHERE thread_id = ? AND ns = ? AND checkpoint_id = ?",
        (thread_id, ns, checkpoint_id),
    ).fetchall()
    return Row(
        ns=ns,
        checkpoint_id=checkpoint_id,
        record=bytes(record),
        fields=fields,
        blobs=[stored.get(f) for f in fields],
        writes=[(bytes(f), bytes(v)) for f, v in writes],
    )


def _drop(db: sqlite3.Connection, thread_id: str, ns: str, checkpoint_id: str) -> None:
    for table in ("lg_checkpoints", "lg_writes"):
        db.execute(
            f"DELETE FROM {table} WHERE thread_id = ? AND ns = ? AND checkpoint_id = ?",
            (thread_id, ns, checkpoint_id),
        )


def _collect_blobs(db: sqlite3.Connection, thread_id: str, ns: str) -> None:
    """Delete the namespace's blobs that no remaining checkpoint reads."""
    used: set[bytes] = set()
    for (refs,) in db.execute(
        "SELECT refs FROM lg_checkpoints WHERE thread_id = ? AND ns = ?", (thread_id, ns)
    ):
        used.update(decode_refs(refs))
    for (field,) in db.execute(
        "SELECT field FROM lg_blobs WHERE thread_id = ? AND ns = ?", (thread_id, ns)
    ).fetchall():
        if bytes(field) not in used:
            db.execute(
                "DELETE FROM lg_blobs WHERE thread_id = ? AND ns = ? AND field = ?",
                (thread_id, ns, field),
            )
