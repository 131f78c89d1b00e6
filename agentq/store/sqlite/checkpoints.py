"""The embedded store's checkpoints: committing a step, setting a status, reading them back."""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Mapping
from typing import Any

from agentq.codec.envelope import build_checkpoint, decode_envelope, encode_checkpoint
from agentq.errors import LogConflict, StepConflict
from agentq.records import Checkpoint, Status
from agentq.store.contract import UNSET, _Unset
from agentq.store.sqlite.connection import SharedConnection
from agentq.store.sqlite.queries import (
    checkpoint_not_found,
    encode,
    fenced,
    release_lease,
    update,
)


class CheckpointsMixin:
    """The checkpoint operations of :class:`~agentq.store.sqlite.store.SQLiteStore`."""

    _conn: SharedConnection
    keep_last: int
    max_checkpoint_bytes: int

    def _do_commit(
        self,
        thread_id: str,
        token: int,
        checkpoint: Checkpoint,
        *,
        status: Status,
        due_in: float | _Unset | None,
        result: Any,
        interrupt: Any,
        release_owner: str | None,
        logs: Mapping[str, int] | None,
    ) -> bool:
        step = checkpoint.step
        encoded = encode_checkpoint(
            thread_id, checkpoint, limit=self.max_checkpoint_bytes, logs=logs
        )
        data = encoded.snapshot
        extra: dict[str, Any] = {}
        if result is not UNSET:
            extra["result"] = encode(result, "result", thread_id, step)
        pause = None if interrupt is UNSET else encode(interrupt, "interrupt", thread_id, step)
        with self._conn.write() as db:
            row = fenced(db, thread_id, token)
            if row["step"] == step and _stored_checkpoint(db, thread_id, step) == data:
                return bool(row["cancel"])  # the same commit again: nothing to change
            if row["step"] != step - 1:
                raise StepConflict(
                    f"cannot commit step {step}: the latest stored step is {row['step']}, not "
                    f"{step - 1}; another write got there first: reload with latest() and "
                    "continue from there",
                    thread_id=thread_id,
                    step=step,
                    latest=row["step"],
                )
            for field, items in encoded.appended.items():
                _append_log(db, thread_id, step, field, (logs or {})[field], items)
            now = time.time()
            db.execute(
                "INSERT OR REPLACE INTO checkpoints (thread_id, step, data) VALUES (?, ?, ?)",
                (thread_id, step, data),
            )
            # Steps are contiguous from ``first`` up, so the oldest kept one is computable.
            first = max(step if row["first"] is None else row["first"], step - self.keep_last + 1)
            db.execute(
                "DELETE FROM checkpoints WHERE thread_id = ? AND step < ?", (thread_id, first)
            )
            if status == Status.WAITING and row["cancel"]:
                status, due_in = _cancelled_at_wait()
            if not isinstance(due_in, _Unset):
                extra["due_at"] = None if due_in is None else now + due_in
            # A step consumed the timeout of an earlier wait; it may start one of its own.
            extra.update(_wait(status, due_in, now))
            # The driver has acted on the resume value and interrupt it read: they are spent;
            # and the step got past whatever error a retry or a failure left.
            update(
                db,
                thread_id,
                now,
                status=Status(status).value,
                step=step,
                node=checkpoint.node,
                attempts=0,
                crashes=0,
                first=first,
                resume=None,
                error=None,
                interrupt=pause,
                **extra,
            )
            if release_owner is not None:
                release_lease(db, thread_id, release_owner, token)
            return bool(row["cancel"])

    def _do_set_status(
        self,
        thread_id: str,
        token: int,
        status: Status,
        *,
        due_in: float | None,
        error: str | _Unset | None,
        attempts: int | _Unset,
        crashes: int | _Unset,
        result: Any,
        interrupt: Any,
        release_owner: str | None,
        raise_fence: bool,
    ) -> None:
        values: dict[str, Any] = {"status": Status(status).value}
        if raise_fence:
            values["fence"] = token + 1
        for name, value in (("error", error), ("attempts", attempts), ("crashes", crashes)):
            if value is not UNSET:
                values[name] = value
        for name, value in (("result", result), ("interrupt", interrupt)):
            if value is not UNSET:
                values[name] = encode(value, name, thread_id, None)
        with self._conn.write() as db:
            if fenced(db, thread_id, token)["cancel"] and status == Status.WAITING:
                status, due_in = _cancelled_at_wait()
                values["status"] = status.value
            now = time.time()
            if due_in is not None and values["status"] == Status.RETRYING.value:
                values["retry_at"] = now + due_in  # acquire() refuses the thread until then
            if values["status"] == Status.WAITING.value:
                values.update(_wait(status, due_in, now))
            update(db, thread_id, now, due_at=None if due_in is None else now + due_in, **values)
            if release_owner is not None:
                release_lease(db, thread_id, release_owner, token)

    def _do_latest(self, thread_id: str) -> Checkpoint | None:
        with self._conn.snapshot() as db:  # the checkpoint and its logs as one moment
            row = db.execute(
                "SELECT c.step, c.data FROM threads t JOIN checkpoints c "
                "ON c.thread_id = t.thread_id AND c.step = t.step WHERE t.thread_id = ?",
                (thread_id,),
            ).fetchone()
            return None if row is None else _load(db, thread_id, row[0], row[1])

    def _do_checkpoint(self, thread_id: str, step: int) -> Checkpoint:
        with self._conn.snapshot() as db:
            row = db.execute(
                "SELECT data FROM checkpoints WHERE thread_id = ? AND step = ?", (thread_id, step)
            ).fetchone()
            if row is None:
                raise checkpoint_not_found(db, thread_id, step)
            return _load(db, thread_id, step, row[0])

    def _do_history(self, thread_id: str, *, before: int | None, limit: int) -> list[Checkpoint]:
        with self._conn.snapshot() as db:
            rows = db.execute(
                "SELECT step, data FROM checkpoints WHERE thread_id = ? AND step < ? "
                "ORDER BY step DESC LIMIT ?",
                (thread_id, math.inf if before is None else before, limit),
            ).fetchall()
            return [_load(db, thread_id, step, data) for step, data in rows]


def _cancelled_at_wait() -> tuple[Status, None]:
    """The status and due time of a thread that would start to wait for a human while a
    cancel is asked: its wait is the step boundary the cancel stops it at, in the same
    write, so no resume ever finds it waiting (a resume clears the request)."""
    return Status.CANCELLED, None


def _wait(status: Status, due_in: float | _Unset | None, now: float) -> dict[str, Any]:
    """The timeout columns of a thread moving to ``status``: a wait for a human with a due
    time times out then (``acquire`` takes it out of the wait); anything else has none."""
    if status == Status.WAITING and isinstance(due_in, (int, float)):
        return {"timeout": due_in, "timeout_at": now + due_in, "timed_out": None}
    return {"timeout": None, "timeout_at": None, "timed_out": None}


def _stored_checkpoint(db: sqlite3.Connection, thread_id: str, step: int) -> bytes | None:
    row = db.execute(
        "SELECT data FROM checkpoints WHERE thread_id = ? AND step = ?", (thread_id, step)
    ).fetchone()
    return None if row is None else bytes(row[0])


def _append_log(
    db: sqlite3.Connection, thread_id: str, step: int, field: str, before: int, items: list[bytes]
) -> None:
    # A log's items are numbered from 0 without gaps, so the last one's index gives its
    # length at one seek of the primary key, where COUNT(*) would read every item.
    (length,) = db.execute(
        "SELECT COALESCE(MAX(idx) + 1, 0) FROM logs WHERE thread_id = ? AND field = ?",
        (thread_id, field),
    ).fetchone()
    if length != before:
        raise LogConflict(
            f"the stored log of state.{field} holds {length} items, not the {before} this "
            "checkpoint continues; reload the thread with latest() and continue from there",
            thread_id=thread_id,
            step=step,
        )
    db.executemany(
        "INSERT INTO logs (thread_id, field, idx, item) VALUES (?, ?, ?, ?)",
        [(thread_id, field, before + i, item) for i, item in enumerate(items)],
    )


def _load(db: sqlite3.Connection, thread_id: str, step: int, data: bytes) -> Checkpoint:
    envelope, lengths = decode_envelope(thread_id, data, step=step)
    items = {
        field: [
            bytes(row[0])
            for row in db.execute(
                "SELECT item FROM logs WHERE thread_id = ? AND field = ? AND idx < ? ORDER BY idx",
                (thread_id, field, length),
            )
        ]
        for field, length in lengths.items()
    }
    return build_checkpoint(thread_id, envelope, items, step=step)
