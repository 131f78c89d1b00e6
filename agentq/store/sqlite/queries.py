"""The statements the embedded store's operations share: fencing, meta, lease, deletion."""

from __future__ import annotations

import math
import sqlite3
import time
from typing import Any, Final

from agentq.codec.envelope import encode_value
from agentq.errors import CheckpointNotFound, StaleToken, ThreadNotFound
from agentq.records import Status, ThreadMeta
from agentq.store.contract.common import checkpoint_not_stored
from agentq.store.meta_fields import meta_from_fields
from agentq.store.sqlite.schema import META_COLUMNS

NOT_FOUND: Final = "the store does not hold this thread; create it with open_thread() first"


def fenced(db: sqlite3.Connection, thread_id: str, token: int) -> sqlite3.Row:
    row = db.execute(
        "SELECT fence, step, first, cancel FROM threads WHERE thread_id = ?",
        (thread_id,),
    ).fetchone()
    if row is None:
        raise ThreadNotFound(NOT_FOUND, thread_id=thread_id)
    if token != row["fence"]:
        raise StaleToken(
            f"fencing token {token} is stale (the current one is {row['fence']}); another "
            "worker has acquired this thread since: stop driving it and leave it to them",
            thread_id=thread_id,
        )
    return row  # type: ignore[no-any-return]


def marks(values: list[Any]) -> str:
    return ", ".join("?" * len(values))


def encode(value: Any, what: str, thread_id: str, step: int | None) -> bytes:
    return encode_value(value, what=what, thread_id=thread_id, step=step)


def status_of(db: sqlite3.Connection, thread_id: str) -> Status:
    row = db.execute("SELECT status FROM threads WHERE thread_id = ?", (thread_id,)).fetchone()
    if row is None:
        raise ThreadNotFound(NOT_FOUND, thread_id=thread_id)
    return Status(row[0])


def leased(db: sqlite3.Connection, thread_id: str) -> bool:
    """Whether a worker holds the thread's lease now."""
    return (
        db.execute(
            "SELECT 1 FROM threads WHERE thread_id = ? AND lock_owner IS NOT NULL "
            "AND lock_expires > ?",
            (thread_id, time.time()),
        ).fetchone()
        is not None
    )


def read_meta(db: sqlite3.Connection, thread_id: str) -> ThreadMeta | None:
    row = db.execute(
        f"SELECT {META_COLUMNS} FROM threads WHERE thread_id = ?", (thread_id,)
    ).fetchone()
    return None if row is None else meta_from_fields(thread_id, dict(row))


def update(db: sqlite3.Connection, thread_id: str, now: float, **values: Any) -> None:
    columns = "".join(f'"{name}" = ?, ' for name in values)
    db.execute(
        f"UPDATE threads SET {columns}updated_at = ? WHERE thread_id = ?",
        (*values.values(), now, thread_id),
    )


def release_lease(
    db: sqlite3.Connection, thread_id: str, owner: str, token: int, *, live_at: float = -math.inf
) -> bool:
    """Clear the lease if ``owner`` holds it with ``token`` and it is live at ``live_at``."""
    cursor = db.execute(
        "UPDATE threads SET lock_owner = NULL, lock_token = NULL, lock_expires = NULL "
        "WHERE thread_id = ? AND lock_owner = ? AND lock_token = ? AND lock_expires > ?",
        (thread_id, owner, token, live_at),
    )
    return cursor.rowcount == 1


def delete_threads(db: sqlite3.Connection, thread_ids: list[str]) -> int:
    places = marks(thread_ids)
    db.execute(f"DELETE FROM checkpoints WHERE thread_id IN ({places})", thread_ids)
    db.execute(f"DELETE FROM effects WHERE scope IN ({places})", thread_ids)
    db.execute(f"DELETE FROM artifacts WHERE thread_id IN ({places})", thread_ids)
    db.execute(f"DELETE FROM logs WHERE thread_id IN ({places})", thread_ids)
    db.execute(f"DELETE FROM key_waiters WHERE thread_id IN ({places})", thread_ids)
    return db.execute(f"DELETE FROM threads WHERE thread_id IN ({places})", thread_ids).rowcount


def due_rows(db: sqlite3.Connection, now: float, limit: int) -> list[tuple[str, float]]:
    rows = db.execute(
        "SELECT thread_id, due_at FROM threads WHERE due_at IS NOT NULL AND due_at <= ? "
        "ORDER BY due_at, thread_id LIMIT ?",
        (now, limit),
    ).fetchall()
    return [(row[0], row[1]) for row in rows]


def checkpoint_not_found(
    db: sqlite3.Connection, thread_id: str, step: int, *, forking: bool = False
) -> CheckpointNotFound:
    """:func:`~agentq.store.contract.checkpoint_not_stored`, with the steps held read in
    the transaction that missed ``step``."""
    row = db.execute("SELECT first, step FROM threads WHERE thread_id = ?", (thread_id,)).fetchone()
    first, latest = (None, None) if row is None else (row[0], row[1])
    return checkpoint_not_stored(thread_id, step, first, latest, forking=forking)
