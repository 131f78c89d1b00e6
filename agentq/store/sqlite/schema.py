"""The tables of the embedded store, and the migrations from older versions of them.

The tables mirror the Redis layout in :mod:`agentq.ids`: ``threads`` holds the meta (the
columns named in :data:`~agentq.store.meta_fields.META_FIELDS`), the lease and the due time;
``checkpoints`` the snapshots; ``effects`` the idempotency records, scoped by thread id or
``''`` for the global ones; ``artifacts`` the content-addressed bytes a thread refers to.
"""

from __future__ import annotations

import sqlite3
from typing import Final

from agentq.errors import StoreConfigError
from agentq.store.meta_fields import META_FIELDS

SCHEMA_VERSION: Final = 9

_META_TYPES: Final = {
    "status": "TEXT NOT NULL",
    "step": "INTEGER NOT NULL",
    "node": "TEXT",
    "task": "TEXT NOT NULL",
    "attempts": "INTEGER NOT NULL DEFAULT 0",
    "crashes": "INTEGER NOT NULL DEFAULT 0",
    "fence": "INTEGER NOT NULL DEFAULT 0",
    "first": "INTEGER",
    "error": "TEXT",
    "created_at": "REAL NOT NULL",
    "updated_at": "REAL NOT NULL",
    "input": "BLOB",
    "result": "BLOB",
    "interrupt": "BLOB",
    "resume": "BLOB",
    "cancel": "INTEGER NOT NULL DEFAULT 0",
    "options": "BLOB",
    "origin": "TEXT",
    "incarnation": "TEXT",
    "reopened": "INTEGER NOT NULL DEFAULT 0",
    "timeout": "REAL",
    "timeout_at": "REAL",
    "timed_out": "BLOB",
}
# Indexing by META_FIELDS makes a field added to the contract fail here, at import.
META_COLUMNS: Final = ", ".join(f'"{name}"' for name in META_FIELDS)
SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS threads (thread_id TEXT PRIMARY KEY, "
    + ", ".join(f'"{name}" {_META_TYPES[name]}' for name in META_FIELDS)
    + ", lock_owner TEXT, lock_token INTEGER, lock_expires REAL, lock_lost INTEGER NOT NULL "
    "DEFAULT 0, due_at REAL, retry_at REAL, canvas_taker TEXT)",
    "CREATE INDEX IF NOT EXISTS threads_due ON threads(due_at) WHERE due_at IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS threads_status ON threads(status, updated_at)",
    "CREATE INDEX IF NOT EXISTS threads_updated ON threads(updated_at)",
    "CREATE TABLE IF NOT EXISTS checkpoints (thread_id TEXT NOT NULL, step INTEGER NOT NULL, "
    "data BLOB NOT NULL, PRIMARY KEY (thread_id, step))",
    'CREATE TABLE IF NOT EXISTS effects (scope TEXT NOT NULL, "key" TEXT NOT NULL, '
    "state TEXT NOT NULL, token INTEGER NOT NULL, result BLOB, claim TEXT, tool TEXT, "
    'claimed_at REAL, claimed_by TEXT, PRIMARY KEY (scope, "key"))',
    "CREATE TABLE IF NOT EXISTS artifacts (thread_id TEXT NOT NULL, digest TEXT NOT NULL, "
    "data BLOB NOT NULL, PRIMARY KEY (thread_id, digest))",
    "CREATE TABLE IF NOT EXISTS leases (name TEXT PRIMARY KEY, owner TEXT NOT NULL, "
    "expires REAL NOT NULL)",
    # The items of append-only state fields; a snapshot records how many belong to it.
    "CREATE TABLE IF NOT EXISTS logs (thread_id TEXT NOT NULL, field TEXT NOT NULL, "
    "idx INTEGER NOT NULL, item BLOB NOT NULL, PRIMARY KEY (thread_id, field, idx))",
    # Fleet-wide rate limits: GCRA times and concurrency slots, as in Redis.
    'CREATE TABLE IF NOT EXISTS limits ("key" TEXT PRIMARY KEY, req_tat REAL NOT NULL, '
    "tok_tat REAL NOT NULL, paused REAL NOT NULL)",
    'CREATE TABLE IF NOT EXISTS limit_holders ("key" TEXT NOT NULL, holder TEXT NOT NULL, '
    'expires REAL NOT NULL, PRIMARY KEY ("key", holder))',
    'CREATE TABLE IF NOT EXISTS limit_takes ("key" TEXT PRIMARY KEY, takes INTEGER NOT NULL)',
    # Concurrency keys: each key's cap, its slots (a lease token, or NULL when reserved
    # for a woken thread) and its parked threads in arrival order.
    'CREATE TABLE IF NOT EXISTS key_caps ("key" TEXT PRIMARY KEY, cap INTEGER NOT NULL)',
    'CREATE TABLE IF NOT EXISTS key_slots ("key" TEXT NOT NULL, thread_id TEXT NOT NULL, '
    'token INTEGER, PRIMARY KEY ("key", thread_id))',
    "CREATE TABLE IF NOT EXISTS key_waiters (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
    '"key" TEXT NOT NULL, thread_id TEXT NOT NULL UNIQUE, since REAL NOT NULL)',
)


_ADDED_COLUMNS: Final = (
    ("effects", "claim TEXT"),  # 2: names each claim, to recognise a resent one
    ("threads", "retry_at REAL"),  # 3: when a retrying thread may run, and how to send it
    ("threads", "options BLOB"),
    ("threads", "origin TEXT"),  # 4: the task that first sent the thread, what claimed
    ("effects", "tool TEXT"),  # an effect and when
    ("effects", "claimed_at REAL"),
    ("threads", "timeout REAL"),  # 5: the timeout of a wait for a human
    ("threads", "timeout_at REAL"),
    ("threads", "timed_out BLOB"),
    ("threads", "lock_lost INTEGER NOT NULL DEFAULT 0"),  # 6: whether a lease's take counted
    ("threads", "canvas_taker TEXT"),  # a lost worker, which task carries the canvas on
    ("threads", "incarnation TEXT"),  # 7: what its tools' downstream keys derive from
    ("effects", "claimed_by TEXT"),  # 8: the thread that claimed a shared effect
    ("threads", "reopened INTEGER NOT NULL DEFAULT 0"),  # 9: whether a person sent it on
)
"""The columns added to the first version's tables, each in the version it came with."""


def _missing_columns(db: sqlite3.Connection) -> list[tuple[str, str]]:
    # Found by name rather than by the file's version: versions 4 and 6 gained columns
    # after they first shipped, so a file's number does not say which it has.
    present = {
        table: {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        for table in {table for table, _ in _ADDED_COLUMNS}
    }
    return [
        (table, column)
        for table, column in _ADDED_COLUMNS
        if present[table] and column.split()[0] not in present[table]
    ]


def needs_migration(db: sqlite3.Connection) -> bool:
    """Whether the file is not at :data:`SCHEMA_VERSION` or lacks a column of it (one
    written when its version had fewer); read alone, without the write lock."""
    (version,) = db.execute("PRAGMA user_version").fetchone()
    return version != SCHEMA_VERSION or bool(_missing_columns(db))


def migrate(db: sqlite3.Connection, path: str) -> None:
    """Create the tables or bring older ones up to :data:`SCHEMA_VERSION`, inside the
    caller's write transaction so that concurrent openers migrate once."""
    (version,) = db.execute("PRAGMA user_version").fetchone()
    if version > SCHEMA_VERSION:
        raise StoreConfigError(
            f"SQLite store {path!r} has schema version {version}, newer than "
            f"this agentq understands ({SCHEMA_VERSION}); upgrade agentq"
        )
    for statement in SCHEMA:
        db.execute(statement)
    for table, column in _missing_columns(db):
        db.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
