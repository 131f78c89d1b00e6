"""The embedded store: one SQLite file, safe for several worker processes on one machine.

Every write is one ``BEGIN IMMEDIATE`` transaction on the process's
:class:`~agentq.store.sqlite.connection.SharedConnection`; reads are single statements, each
seeing one committed state. The tables are in :mod:`agentq.store.sqlite.schema`, the
checkpoint, effect, lease and limit operations in the mixins this class is made of.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final

from agentq.codec.envelope import decode_checkpoint, decode_envelope
from agentq.errors import (
    ArtifactNotFound,
    StoreConfigError,
    ThreadExists,
)
from agentq.ids import new_incarnation
from agentq.records import Finding, Schedule, Status, ThreadMeta
from agentq.settings import DEFAULT_KEEP_LAST, DEFAULT_MAX_CHECKPOINT_BYTES
from agentq.store.contract import UNSET, Store, final_checkpoint, refuse_graph_fork
from agentq.store.contract.threads import not_reopenable
from agentq.store.meta_fields import meta_from_fields
from agentq.store.sqlite.checkpoints import CheckpointsMixin
from agentq.store.sqlite.connection import SharedConnection, durability_findings, passes
from agentq.store.sqlite.effects import EffectsMixin
from agentq.store.sqlite.graph import SQLiteGraph, copy_rows, holds
from agentq.store.sqlite.leases import LeasesMixin
from agentq.store.sqlite.limits import LimitsMixin
from agentq.store.sqlite.listing import ListingMixin
from agentq.store.sqlite.queries import (
    checkpoint_not_found,
    delete_threads,
    encode,
    leased,
    marks,
    read_meta,
    status_of,
    update,
)
from agentq.store.sqlite.schema import META_COLUMNS
from agentq.store.sqlite.thread_keys import ThreadKeysMixin

_URL_PREFIX: Final = "sqlite:///"
_GC_BATCH: Final = 500


def path_of_url(url: str) -> str:
    """The file a ``sqlite:///`` URL names; :class:`~agentq.errors.StoreConfigError` for
    a URL that names none, or adds what agentq would not honour."""
    if not url.startswith(_URL_PREFIX):
        raise StoreConfigError(
            f"cannot use store URL {url!r}; write sqlite:///relative/path.db or "
            "sqlite:////absolute/path.db (no host)"
        )
    path = url[len(_URL_PREFIX) :]
    cut = min((at for at in (path.find("?"), path.find("#")) if at >= 0), default=-1)
    if cut >= 0:
        # SQLite's own URI options (mode=ro, cache=shared) would change how every
        # process shares the file; agentq opens it one way, so none are taken.
        what = "query string" if path[cut] == "?" else "fragment"
        raise StoreConfigError(
            f"store URL {url!r} has a {what} ({path[cut:]}), which a SQLite store URL does "
            f"not take; write the path alone, e.g. sqlite:///{path[:cut] or 'agentq.db'}"
        )
    return path


class SQLiteStore(
    CheckpointsMixin, EffectsMixin, LeasesMixin, LimitsMixin, ListingMixin, ThreadKeysMixin, Store
):
    """A :class:`Store` in one SQLite file, for local use, tests and single-host deployments.

    One connection per store object and process, shared by its threads under a lock.
    """

    transient_errors = (sqlite3.OperationalError,)

    def is_transient(self, exc: BaseException) -> bool:
        """ "database is locked" past the busy timeout, or the disk failing, full or gone:
        retry later. A read-only file, a missing table or a bad statement fails the same
        way every time, and retrying it would only keep the thread from failing."""
        return passes(exc)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        keep_last: int = DEFAULT_KEEP_LAST,
        max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
    ) -> None:
        super().__init__(keep_last=keep_last, max_checkpoint_bytes=max_checkpoint_bytes)
        given = os.fspath(path)
        if given in ("", ":memory:"):
            raise StoreConfigError(
                f"SQLite path {given!r} is a private database no other worker can see; "
                "give a file path, e.g. sqlite:///agentq.db"
            )
        # Resolved once: a worker that changes directory later must reopen the same file.
        self.path = os.path.abspath(given)
        directory = os.path.dirname(self.path)
        if not os.path.isdir(directory):
            raise StoreConfigError(
                f"directory {directory!r} of the SQLite store {self.path!r} does not exist; "
                "create it first or point the store at an existing directory"
            )
        self._conn = SharedConnection(self.path)
        with self._conn.locked():
            pass  # connect now, so a bad path or a newer schema fails at startup

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SQLiteStore:
        """Open ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``."""
        return cls(path_of_url(url), **options)

    # -- threads -------------------------------------------------------------------------

    def _do_open_thread(
        self,
        thread_id: str,
        *,
        task: str,
        node: str | None,
        input: Any,
        start_grace: float,
        options: Mapping[str, Any] | None,
        origin: str | None,
    ) -> tuple[ThreadMeta, bool]:
        data = encode(input, "input", thread_id, None)
        sending = encode(options or None, "options", thread_id, None)
        with self._conn.write() as db:
            now = time.time()
            created = db.execute(
                "INSERT INTO threads (thread_id, status, step, node, task, created_at, "
                "updated_at, input, due_at, options, origin, incarnation) "
                "VALUES (?, ?, -1, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (
                    thread_id,
                    Status.QUEUED.value,
                    node,
                    task,
                    now,
                    now,
                    data,
                    now + start_grace,
                    sending,
                    origin,
                    new_incarnation(),
                ),
            ).rowcount
            meta = read_meta(db, thread_id)
        assert meta is not None
        return meta, created == 1

    def _do_meta(self, thread_id: str) -> ThreadMeta | None:
        with self._conn.locked() as db:
            return read_meta(db, thread_id)

    def threads(
        self, status: Status | None = None, *, limit: int = 100, offset: int = 0
    ) -> list[ThreadMeta]:
        where, args = ("WHERE status = ?", [Status(status).value]) if status else ("", [])
        with self._conn.locked() as db:
            rows = db.execute(
                f"SELECT thread_id, {META_COLUMNS} FROM threads {where} "
                "ORDER BY updated_at DESC, thread_id DESC LIMIT ? OFFSET ?",
                (*args, limit, offset),
            ).fetchall()
        return [meta_from_fields(row["thread_id"], dict(row)) for row in rows]

    def status_counts(self) -> dict[Status, int]:
        with self._conn.locked() as db:
            rows = db.execute("SELECT status, COUNT(*) FROM threads GROUP BY status").fetchall()
        counts = dict.fromkeys(Status, 0)
        counts.update({Status(status): count for status, count in rows})
        return counts

    def _do_schedules(self, thread_ids: Sequence[str]) -> list[Schedule]:
        with self._conn.locked() as db:
            rows = db.execute(
                "SELECT thread_id, lock_owner, lock_token, lock_expires, due_at FROM threads "
                f"WHERE thread_id IN ({marks(list(thread_ids))})",
                tuple(thread_ids),
            ).fetchall()
        now = time.time()
        by_id = {row["thread_id"]: row for row in rows}
        found = []
        for thread_id in thread_ids:
            row = by_id.get(thread_id)
            if row is None:
                found.append(Schedule(thread_id))
            elif row["lock_owner"] is None or row["lock_expires"] <= now:
                found.append(Schedule(thread_id, due_at=row["due_at"]))
            else:
                found.append(
                    Schedule(
                        thread_id,
                        owner=row["lock_owner"],
                        token=row["lock_token"],
                        lease_left=row["lock_expires"] - now,
                        due_at=row["due_at"],
                    )
                )
        return found

    def _do_delete_thread(self, thread_id: str) -> bool:
        with self._conn.write() as db:
            return delete_threads(db, [thread_id]) == 1

    def _do_fork(self, thread_id: str, step: int, new_thread_id: str) -> ThreadMeta:
        with self._conn.write() as db:
            source = db.execute(
                "SELECT c.data, t.task, t.input, t.options, t.status, t.step FROM checkpoints c "
                "JOIN threads t ON t.thread_id = c.thread_id WHERE c.thread_id = ? AND c.step = ?",
                (thread_id, step),
            ).fetchone()
            if source is None:
                raise checkpoint_not_found(db, thread_id, step, forking=True)
            node = decode_checkpoint(thread_id, source["data"], step=step).node
            if node is None:
                raise final_checkpoint(thread_id, step)
            # In this write transaction no LangGraph write lands: the copy is one instant's.
            graph = holds(db, thread_id)
            if graph:
                refuse_graph_fork(thread_id, step, Status(source["status"]), source["step"])
            now = time.time()
            try:
                db.execute(
                    "INSERT INTO threads (thread_id, status, step, node, task, first, "
                    "created_at, updated_at, input, options, incarnation) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        new_thread_id,
                        Status.WAITING.value,
                        step,
                        node,
                        source["task"],
                        step,
                        now,
                        now,
                        source["input"],
                        source["options"],
                        new_incarnation(),
                    ),
                )
            except sqlite3.IntegrityError:
                raise ThreadExists(
                    f"cannot fork step {step} of {thread_id!r} into an id that is taken; "
                    "pick a new thread id or delete the existing thread first",
                    thread_id=new_thread_id,
                ) from None
            # Effect records are a previous driver's claims; the fork starts without them.
            db.execute(
                "INSERT OR REPLACE INTO checkpoints (thread_id, step, data) VALUES (?, ?, ?)",
                (new_thread_id, step, source["data"]),
            )
            _, lengths = decode_envelope(thread_id, source["data"], step=step)
            for field, length in lengths.items():
                db.execute(
                    "INSERT INTO logs (thread_id, field, idx, item) SELECT ?, field, idx, item "
                    "FROM logs WHERE thread_id = ? AND field = ? AND idx < ?",
                    (new_thread_id, thread_id, field, length),
                )
            # Every artifact, not only those the checkpoint names: a reference may sit
            # anywhere in its state, logs or cursors, and a digest is always the same bytes.
            db.execute(
                "INSERT OR IGNORE INTO artifacts (thread_id, digest, data) "
                "SELECT ?, digest, data FROM artifacts WHERE thread_id = ?",
                (new_thread_id, thread_id),
            )
            if graph:
                copy_rows(db, thread_id, new_thread_id)
            meta = read_meta(db, new_thread_id)
        assert meta is not None
        return meta

    def _do_reopen(
        self,
        thread_id: str,
        *,
        from_statuses: Collection[Status],
        resume_value: Any,
        start_grace: float,
    ) -> ThreadMeta:
        # The interrupt has been answered (or abandoned) once a thread is queued again.
        values: dict[str, Any] = {
            "status": Status.QUEUED.value,
            "error": None,
            "attempts": 0,
            "crashes": 0,
            "cancel": 0,
            "interrupt": None,
            "reopened": 1,
        }
        if resume_value is not UNSET:
            values["resume"] = encode(resume_value, "resume value", thread_id, None)
        with self._conn.write() as db:
            status = status_of(db, thread_id)
            if status not in {Status(s) for s in from_statuses}:
                raise not_reopenable(thread_id, status.value, from_statuses)
            if status == Status.WAITING:  # answered in time: the timeout never fires
                values.update(timeout=None, timeout_at=None)
            now = time.time()
            update(db, thread_id, now, due_at=now + start_grace, **values)
            # A status write of the last driver, sent again, is refused rather than undo it.
            db.execute("UPDATE threads SET fence = fence + 1 WHERE thread_id = ?", (thread_id,))
            meta = read_meta(db, thread_id)
        assert meta is not None
        return meta

    def _do_request_cancel(self, thread_id: str) -> Status:
        with self._conn.write() as db:
            status = status_of(db, thread_id)
            if status.finished:
                return status
            db.execute("UPDATE threads SET cancel = 1 WHERE thread_id = ?", (thread_id,))
            if status == Status.RUNNING and leased(db, thread_id):
                return status  # its driver stops at the next commit, which reports the flag
            db.execute("DELETE FROM key_waiters WHERE thread_id = ?", (thread_id,))  # parked
            update(
                db,
                thread_id,
                time.time(),
                status=Status.CANCELLED.value,
                due_at=None,
                timeout_at=None,
            )
            db.execute("UPDATE threads SET fence = fence + 1 WHERE thread_id = ?", (thread_id,))
            return Status.CANCELLED

    def _do_take_canvas(self, thread_id: str, taker: str) -> bool:
        with self._conn.write() as db:
            db.execute(
                "UPDATE threads SET canvas_taker = ? WHERE thread_id = ? AND canvas_taker IS NULL",
                (taker, thread_id),
            )
            row = db.execute(
                "SELECT canvas_taker FROM threads WHERE thread_id = ?", (thread_id,)
            ).fetchone()
        return row is not None and row["canvas_taker"] == taker

    def _do_put_artifact(self, thread_id: str, data: bytes) -> str | None:
        digest = hashlib.sha256(data).hexdigest()
        with self._conn.write() as db:
            if db.execute("SELECT 1 FROM threads WHERE thread_id = ?", (thread_id,)).fetchone():
                db.execute(
                    "INSERT INTO artifacts (thread_id, digest, data) VALUES (?, ?, ?) "
                    "ON CONFLICT DO NOTHING",
                    (thread_id, digest, bytes(data)),
                )
                return digest
        return None

    def _do_get_artifact(self, thread_id: str, digest: str) -> bytes:
        with self._conn.locked() as db:
            row = db.execute(
                "SELECT data FROM artifacts WHERE thread_id = ? AND digest = ?",
                (thread_id, digest),
            ).fetchone()
        if row is None:
            raise ArtifactNotFound(
                f"artifact {digest!r} is not stored for this thread; it went with a deleted "
                "thread, or the reference belongs to another thread",
                thread_id=thread_id,
            )
        return bytes(row[0])

    def _do_gc(self, finished_ttl: float, statuses: frozenset[Status], limit: int | None) -> int:
        names = sorted(s.value for s in statuses)
        deleted = 0
        while True:
            batch = _GC_BATCH if limit is None else min(_GC_BATCH, limit - deleted)
            # Batches keep the write lock short, so workers' commits are not held up.
            with self._conn.write() as db:
                rows = db.execute(
                    f"SELECT thread_id FROM threads WHERE status IN ({marks(names)}) "
                    "AND updated_at < ? LIMIT ?",
                    (*names, time.time() - finished_ttl, batch),
                ).fetchall()
                deleted += delete_threads(db, [row[0] for row in rows])
            if len(rows) < batch or deleted == limit:
                return deleted

    # -- operations ----------------------------------------------------------------------

    @property
    def key_namespace(self) -> str:
        return os.path.basename(self.path)

    def check(self) -> list[Finding]:
        with self._conn.locked() as db:
            return durability_findings(db, self.path)

    def close(self) -> None:
        self._conn.close()

    def graph(self) -> SQLiteGraph:
        return SQLiteGraph(self.path, connection=self._conn.locked, transaction=self._conn.write)
