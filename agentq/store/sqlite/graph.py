"""The graph store in the agentq SQLite file: three tables beside the store's own.

It runs on the store's connection (one per process, reopened after ``fork()``) and its
transactions. Each write is one ``BEGIN IMMEDIATE`` transaction that reads the thread's
fence from the store's ``threads`` table and writes only if the writer may, so the check
and the write are one atomic step against every other process. A trigger deletes a
thread's LangGraph rows when the store deletes (or expires) the thread, in the store's own
transaction.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Final

from agentq.errors import StoreConfigError
from agentq.store.graph import GraphStore, lease_held, stale_token, thread_not_found
from agentq.store.graph_records import Row, StoredCheckpoint, decode_refs, field_channel

Connection = Callable[[], AbstractContextManager[sqlite3.Connection]]
"""Hands out the store's connection, held for the duration of the ``with``."""

_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS lg_checkpoints (thread_id TEXT NOT NULL, ns TEXT NOT NULL, "
    "checkpoint_id TEXT NOT NULL, run_id TEXT, record BLOB NOT NULL, refs BLOB NOT NULL, "
    "PRIMARY KEY (thread_id, ns, checkpoint_id))",
    "CREATE INDEX IF NOT EXISTS lg_checkpoints_run ON lg_checkpoints(run_id) "
    "WHERE run_id IS NOT NULL",
    "CREATE TABLE IF NOT EXISTS lg_blobs (thread_id TEXT NOT NULL, ns TEXT NOT NULL, "
    "field BLOB NOT NULL, value BLOB NOT NULL, PRIMARY KEY (thread_id, ns, field))",
    "CREATE TABLE IF NOT EXISTS lg_writes (thread_id TEXT NOT NULL, ns TEXT NOT NULL, "
    "checkpoint_id TEXT NOT NULL, field BLOB NOT NULL, value BLOB NOT NULL, run_id TEXT, "
    "PRIMARY KEY (thread_id, ns, checkpoint_id, field))",
    "CREATE TRIGGER IF NOT EXISTS lg_thread_deleted AFTER DELETE ON threads BEGIN "
    "DELETE FROM lg_checkpoints WHERE thread_id = OLD.thread_id; "
    "DELETE FROM lg_blobs WHERE thread_id = OLD.thread_id; "
    "DELETE FROM lg_writes WHERE thread_id = OLD.thread_id; END",
)
_WRITES_RUN_INDEX: Final = (
    "CREATE INDEX IF NOT EXISTS lg_writes_run ON lg_writes(run_id) WHERE run_id IS NOT NULL"
)


class SQLiteGraph(GraphStore):
    """On the store's connection: ``connection`` holds it, ``transaction`` holds it inside
    one ``BEGIN IMMEDIATE`` transaction. Creates its tables at construction, so a bad file
    fails there."""

    def __init__(self, path: str, *, connection: Connection, transaction: Connection) -> None:
        self._connection = connection
        self._transaction = transaction
        try:
            with transaction() as db:
                for statement in _SCHEMA:
                    db.execute(statement)
                # Files made before writes recorded their run lack the column.
                columns = {row[1] for row in db.execute("PRAGMA table_info(lg_writes)")}
                if "run_id" not in columns:
                    db.execute("ALTER TABLE lg_writes ADD COLUMN run_id TEXT")
                db.execute(_WRITES_RUN_INDEX)
        except sqlite3.Error as exc:
            raise StoreConfigError(
                f"cannot keep LangGraph checkpoints in SQLite store {path!r} ({exc}); "
                "check that it is an agentq database this user may write"
            ) from exc

    # -- plumbing -------------------------------------------------------------------------

    @contextmanager
    def _write(self, thread_id: str, token: int | None) -> Iterator[sqlite3.Connection]:
        with self._transaction() as db:
            _check_fence(db, thread_id, token)
            yield db

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        # One deferred transaction: every statement of a read sees the same snapshot.
        with self._connection() as db:
            try:
                db.execute("BEGIN")  # in the try: a signal's exception just after it ends it
                yield db
            finally:
                if db.in_transaction:
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
            if stored.clears_failures:
                db.execute(
                    "UPDATE threads SET attempts = 0, crashes = 0 WHERE thread_id = ?",
                    (thread_id,),
                )

    def put_writes(
        self,
        thread_id: str,
        ns: str,
        checkpoint_id: str,
        writes: Sequence[tuple[bytes, bytes, bool]],
        token: int | None,
        run_id: str | None,
    ) -> None:
        with self._write(thread_id, token) as db:
            for field, value, replace in writes:
                verb = "REPLACE" if replace else "IGNORE"
                db.execute(
                    f"INSERT OR {verb} INTO lg_writes (thread_id, ns, checkpoint_id, field, "
                    "value, run_id) VALUES (?, ?, ?, ?, ?, ?)",
                    (thread_id, ns, checkpoint_id, field, value, run_id),
                )

    # -- reads ----------------------------------------------------------------------------

    def get(
        self,
        thread_id: str,
        ns: str,
        checkpoint_id: str | None,
        channels: Collection[str] | None = None,
    ) -> Row | None:
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
            return None if found is None else _row(db, thread_id, ns, found, channels)

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
        with self._connection() as db:
            rows = db.execute(
                "SELECT DISTINCT ns FROM lg_checkpoints WHERE thread_id = ? ORDER BY ns",
                (thread_id,),
            ).fetchall()
        return [row[0] for row in rows]

    def threads(self) -> list[str]:
        with self._connection() as db:
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
        with self._connection() as db:
            threads = [
                row[0]
                for row in db.execute(
                    f"SELECT thread_id FROM lg_checkpoints WHERE run_id IN ({marks}) UNION "
                    f"SELECT thread_id FROM lg_writes WHERE run_id IN ({marks})",
                    (*run_ids, *run_ids),
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
                # What the runs wrote to the checkpoints they resumed from.
                db.execute(
                    f"DELETE FROM lg_writes WHERE thread_id = ? AND run_id IN ({marks})",
                    (thread_id, *run_ids),
                )
                for ns in sorted({ns for ns, _ in gone}):
                    _collect_blobs(db, thread_id, ns)

    def keep_latest(self, thread_id: str, keep: Mapping[str, Collection[str]]) -> None:
        with self._write(thread_id, None) as db:
            stale = [
                (ns, checkpoint_id)
                for ns, checkpoint_id in db.execute(
                    "SELECT ns, checkpoint_id FROM lg_checkpoints c WHERE thread_id = ? AND "
                    "checkpoint_id < (SELECT MAX(checkpoint_id) FROM lg_checkpoints WHERE "
                    "thread_id = c.thread_id AND ns = c.ns)",
                    (thread_id,),
                ).fetchall()
                if checkpoint_id not in keep.get(ns, ())
            ]
            for ns, checkpoint_id in stale:
                _drop(db, thread_id, ns, checkpoint_id)
            for ns in sorted({ns for ns, _ in stale}):
                _collect_blobs(db, thread_id, ns)

    def copy_thread(self, source: str, target: str) -> None:
        with self._write(target, None) as db:
            copy_rows(db, source, target)


def holds(db: sqlite3.Connection, thread_id: str) -> bool:
    """Whether the thread has LangGraph checkpoints; ``False`` in a file whose LangGraph
    tables were never made (no saver ever opened it)."""
    made = db.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'lg_checkpoints'"
    ).fetchone()
    return (
        made is not None
        and db.execute(
            "SELECT 1 FROM lg_checkpoints WHERE thread_id = ? LIMIT 1", (thread_id,)
        ).fetchone()
        is not None
    )


def copy_rows(db: sqlite3.Connection, source: str, target: str) -> None:
    """Copy every checkpoint, blob and write of ``source`` under ``target``, in the
    caller's transaction."""
    for table, columns in (
        ("lg_checkpoints", "ns, checkpoint_id, run_id, record, refs"),
        ("lg_blobs", "ns, field, value"),
        ("lg_writes", "ns, checkpoint_id, field, value, run_id"),
    ):
        db.execute(
            f"INSERT OR REPLACE INTO {table} (thread_id, {columns}) "
            f"SELECT ?, {columns} FROM {table} WHERE thread_id = ?",
            (target, source),
        )


def _check_fence(db: sqlite3.Connection, thread_id: str, token: int | None) -> None:
    found = db.execute(
        "SELECT fence, lock_owner, lock_expires FROM threads WHERE thread_id = ?", (thread_id,)
    ).fetchone()
    if token is None:
        expires = None if found is None or found[1] is None else found[2]
        if expires is not None and expires > time.time():
            raise lease_held(thread_id, max(1, math.ceil((expires - time.time()) * 1000)))
        return
    if found is None:
        raise thread_not_found(thread_id)
    if found[0] != token:
        raise stale_token(thread_id, token, found[0])


def _row(
    db: sqlite3.Connection,
    thread_id: str,
    ns: str,
    found: Any,
    channels: Collection[str] | None = None,
) -> Row:
    checkpoint_id, record, refs = found
    fields = decode_refs(refs) if refs else []
    if channels is not None:
        fields = [f for f in fields if field_channel(f) in channels]
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
