"""The embedded store: one SQLite file, safe for several worker processes on one machine.

Every write is one ``BEGIN IMMEDIATE`` transaction, so SQLite's write lock serialises it
against every other process and it commits whole or not at all. The database runs in WAL
mode with ``synchronous=FULL``: a commit that returned is on disk before the caller
acknowledges the step. Reads are single statements, each seeing one committed state.

The tables mirror the Redis layout in :mod:`agentq.ids`: ``threads`` holds the meta (the
columns named in :data:`~agentq.store.contract.META_FIELDS`), the lease and the due time;
``checkpoints`` the snapshots; ``effects`` the idempotency records, scoped by thread id or
``''`` for the global ones; ``artifacts`` the content-addressed bytes a thread refers to.
"""

from __future__ import annotations

import hashlib
import math
import os
import sqlite3
import threading
import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final

from agentq.codec.envelope import (
    build_checkpoint,
    decode_checkpoint,
    decode_envelope,
    decode_value,
    encode_checkpoint,
    encode_value,
)
from agentq.errors import (
    ArtifactNotFound,
    CheckpointNotFound,
    EffectError,
    LeaseHeld,
    LeaseLost,
    LogConflict,
    StaleToken,
    StepConflict,
    StoreConfigError,
    ThreadExists,
    ThreadNotFound,
    ThreadStateError,
)
from agentq.records import FINISHED, Checkpoint, Claim, Effect, Finding, Status, ThreadMeta
from agentq.settings import DEFAULT_KEEP_LAST, DEFAULT_MAX_CHECKPOINT_BYTES
from agentq.store.contract import (
    UNSET,
    Store,
    _Unset,
    retry_not_due,
)
from agentq.store.meta_fields import META_FIELDS, meta_from_fields
from agentq.store.sqlite.graph import SQLiteGraph

BUSY_TIMEOUT: Final = 30.0
"""Seconds a write waits for another process's transaction before giving up."""
SCHEMA_VERSION: Final = 3
_URL_PREFIX: Final = "sqlite:///"
_GC_BATCH: Final = 500

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
}
# Indexing by META_FIELDS makes a field added to the contract fail here, at import.
_META_COLUMNS: Final = ", ".join(f'"{name}"' for name in META_FIELDS)
_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS threads (thread_id TEXT PRIMARY KEY, "
    + ", ".join(f'"{name}" {_META_TYPES[name]}' for name in META_FIELDS)
    + ", lock_owner TEXT, lock_token INTEGER, lock_expires REAL, due_at REAL, retry_at REAL)",
    "CREATE INDEX IF NOT EXISTS threads_due ON threads(due_at) WHERE due_at IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS threads_status ON threads(status, updated_at)",
    "CREATE INDEX IF NOT EXISTS threads_updated ON threads(updated_at)",
    "CREATE TABLE IF NOT EXISTS checkpoints (thread_id TEXT NOT NULL, step INTEGER NOT NULL, "
    "data BLOB NOT NULL, PRIMARY KEY (thread_id, step))",
    'CREATE TABLE IF NOT EXISTS effects (scope TEXT NOT NULL, "key" TEXT NOT NULL, '
    "state TEXT NOT NULL, token INTEGER NOT NULL, result BLOB, claim TEXT, "
    'PRIMARY KEY (scope, "key"))',
    "CREATE TABLE IF NOT EXISTS artifacts (thread_id TEXT NOT NULL, digest TEXT NOT NULL, "
    "data BLOB NOT NULL, PRIMARY KEY (thread_id, digest))",
    "CREATE TABLE IF NOT EXISTS leases (name TEXT PRIMARY KEY, owner TEXT NOT NULL, "
    "expires REAL NOT NULL)",
    # The items of append-only state fields; a snapshot records how many belong to it.
    "CREATE TABLE IF NOT EXISTS logs (thread_id TEXT NOT NULL, field TEXT NOT NULL, "
    "idx INTEGER NOT NULL, item BLOB NOT NULL, PRIMARY KEY (thread_id, field, idx))",
)

_NOT_FOUND = "the store does not hold this thread; create it with open_thread() first"


class SQLiteStore(Store):
    """A :class:`Store` in one SQLite file, for local use, tests and single-host deployments.

    One connection per store object, shared by its threads (a heartbeat thread renews the
    lease while the task commits) under a lock. A process forked after opening (Celery
    prefork) opens its own connection on first use: SQLite connections must not cross
    ``fork()``.
    """

    # "database is locked" past the busy timeout, or the disk gone: retry later.
    transient_errors = (sqlite3.OperationalError,)

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
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._db: sqlite3.Connection | None = None
        # Connections inherited through fork() are kept referenced, never closed: closing
        # one in the child could run SQLite's last-connection cleanup on the parent's WAL.
        self._inherited: list[sqlite3.Connection] = []
        with self._locked():
            pass  # connect now, so a bad path or a newer schema fails at startup

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SQLiteStore:
        """Open ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``."""
        if not url.startswith(_URL_PREFIX) or "?" in url or "#" in url:
            raise StoreConfigError(
                f"cannot use store URL {url!r}; write sqlite:///relative/path.db or "
                "sqlite:////absolute/path.db (no host, no query string)"
            )
        return cls(url[len(_URL_PREFIX) :], **options)

    # -- connection ----------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StoreConfigError(
                f"cannot open SQLite store {self.path!r} ({exc}); check the path and that "
                "this user may read and write it"
            ) from exc
        db.row_factory = sqlite3.Row
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            with immediate_transaction(db):
                (version,) = db.execute("PRAGMA user_version").fetchone()
                if version > SCHEMA_VERSION:
                    raise StoreConfigError(
                        f"SQLite store {self.path!r} has schema version {version}, newer than "
                        f"this agentq understands ({SCHEMA_VERSION}); upgrade agentq"
                    )
                for statement in _SCHEMA:
                    db.execute(statement)
                if version == 1:  # version 2 names each claim, to recognise a resent one
                    db.execute("ALTER TABLE effects ADD COLUMN claim TEXT")
                if version in (1, 2):  # version 3: when a retrying thread may run, and how
                    db.execute("ALTER TABLE threads ADD COLUMN retry_at REAL")  # to send it
                    db.execute("ALTER TABLE threads ADD COLUMN options BLOB")
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except sqlite3.DatabaseError as exc:
            db.close()
            raise StoreConfigError(
                f"cannot use SQLite store {self.path!r} ({exc}); check that it is an agentq "
                "database on a local disk and that no process keeps it locked"
            ) from exc
        except BaseException:
            db.close()
            raise
        return db

    def _after_fork(self) -> None:
        if self._pid != os.getpid():
            # The lock may have been held by a parent thread that does not exist here.
            self._lock = threading.Lock()
            if self._db is not None:
                self._inherited.append(self._db)
            self._db, self._pid = None, os.getpid()

    @contextmanager
    def _locked(self) -> Iterator[sqlite3.Connection]:
        self._after_fork()
        with self._lock:
            if self._db is None:
                self._db = self._connect()
            yield self._db

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._locked() as db, immediate_transaction(db):
            yield db

    def _fenced(self, db: sqlite3.Connection, thread_id: str, token: int) -> sqlite3.Row:
        row = db.execute(
            "SELECT fence, step, first, cancel FROM threads WHERE thread_id = ?",
            (thread_id,),
        ).fetchone()
        if row is None:
            raise ThreadNotFound(_NOT_FOUND, thread_id=thread_id)
        if token != row["fence"]:
            raise StaleToken(
                f"fencing token {token} is stale (the current one is {row['fence']}); another "
                "worker has acquired this thread since: stop driving it and leave it to them",
                thread_id=thread_id,
            )
        return row  # type: ignore[no-any-return]

    # -- threads -------------------------------------------------------------------------

    def _do_open_thread(
        self,
        thread_id: str,
        *,
        task: str,
        input: Any,
        start_grace: float,
        options: Mapping[str, Any] | None,
    ) -> tuple[ThreadMeta, bool]:
        data = _value(input, "input", thread_id, None)
        sending = _value(options or None, "options", thread_id, None)
        with self._write() as db:
            now = time.time()
            created = db.execute(
                "INSERT INTO threads (thread_id, status, step, task, created_at, updated_at, "
                "input, due_at, options) VALUES (?, ?, -1, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT DO NOTHING",
                (thread_id, Status.QUEUED.value, task, now, now, data, now + start_grace, sending),
            ).rowcount
            meta = _read_meta(db, thread_id)
        assert meta is not None
        return meta, created == 1

    def _do_meta(self, thread_id: str) -> ThreadMeta | None:
        with self._locked() as db:
            return _read_meta(db, thread_id)

    def threads(
        self, status: Status | None = None, *, limit: int = 100, offset: int = 0
    ) -> list[ThreadMeta]:
        where, args = ("WHERE status = ?", [Status(status).value]) if status else ("", [])
        with self._locked() as db:
            rows = db.execute(
                f"SELECT thread_id, {_META_COLUMNS} FROM threads {where} "
                "ORDER BY updated_at DESC, thread_id DESC LIMIT ? OFFSET ?",
                (*args, limit, offset),
            ).fetchall()
        return [meta_from_fields(row["thread_id"], dict(row)) for row in rows]

    def _do_delete_thread(self, thread_id: str) -> bool:
        with self._write() as db:
            return _delete(db, [thread_id]) == 1

    def _do_fork(self, thread_id: str, step: int, new_thread_id: str) -> ThreadMeta:
        with self._write() as db:
            source = db.execute(
                "SELECT c.data, t.task, t.input, t.options FROM checkpoints c JOIN threads t "
                "ON t.thread_id = c.thread_id WHERE c.thread_id = ? AND c.step = ?",
                (thread_id, step),
            ).fetchone()
            if source is None:
                raise _checkpoint_not_found(thread_id, step, self.keep_last)
            node = decode_checkpoint(thread_id, source["data"], step=step).node
            now = time.time()
            try:
                db.execute(
                    "INSERT INTO threads (thread_id, status, step, node, task, first, "
                    "created_at, updated_at, input, options) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
            meta = _read_meta(db, new_thread_id)
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
            "cancel": 0,
            "interrupt": None,
        }
        if resume_value is not UNSET:
            values["resume"] = _value(resume_value, "resume_value", thread_id, None)
        with self._write() as db:
            status = _status(db, thread_id)
            if status not in {Status(s) for s in from_statuses}:
                raise ThreadStateError(
                    f"cannot reopen a thread in status {status.value!r} (only from "
                    f"{sorted(Status(s).value for s in from_statuses)}); wait until it is "
                    "one of those, or fork it to start over from a checkpoint",
                    thread_id=thread_id,
                    status=status.value,
                )
            now = time.time()
            _update(db, thread_id, now, due_at=now + start_grace, **values)
            meta = _read_meta(db, thread_id)
        assert meta is not None
        return meta

    def _do_request_cancel(self, thread_id: str) -> Status:
        with self._write() as db:
            status = _status(db, thread_id)
            if status.finished:
                return status
            db.execute("UPDATE threads SET cancel = 1 WHERE thread_id = ?", (thread_id,))
            if status == Status.RUNNING:
                return status  # its driver stops at the next commit, which reports the flag
            _update(db, thread_id, time.time(), status=Status.CANCELLED.value, due_at=None)
            return Status.CANCELLED

    def _do_put_artifact(self, thread_id: str, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        with self._write() as db:
            db.execute(
                "INSERT INTO artifacts (thread_id, digest, data) VALUES (?, ?, ?) "
                "ON CONFLICT DO NOTHING",
                (thread_id, digest, bytes(data)),
            )
        return digest

    def _do_get_artifact(self, thread_id: str, digest: str) -> bytes:
        with self._locked() as db:
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

    def gc(self, finished_ttl: float) -> int:
        statuses = sorted(s.value for s in FINISHED)
        deleted = 0
        while True:
            # Batches keep the write lock short, so workers' commits are not held up.
            with self._write() as db:
                rows = db.execute(
                    f"SELECT thread_id FROM threads WHERE status IN ({_marks(statuses)}) "
                    "AND updated_at < ? LIMIT ?",
                    (*statuses, time.time() - finished_ttl, _GC_BATCH),
                ).fetchall()
                deleted += _delete(db, [row[0] for row in rows])
            if len(rows) < _GC_BATCH:
                return deleted

    # -- lease ---------------------------------------------------------------------------

    def _do_acquire(self, thread_id: str, owner: str, ttl: float) -> int:
        with self._write() as db:
            now = time.time()
            row = db.execute(
                "SELECT status, fence, lock_owner, lock_expires, retry_at FROM threads "
                "WHERE thread_id = ?",
                (thread_id,),
            ).fetchone()
            if row is None:
                raise ThreadNotFound(_NOT_FOUND, thread_id=thread_id)
            if row["status"] == Status.RETRYING.value and (row["retry_at"] or 0) > now:
                raise retry_not_due(thread_id, row["retry_at"] - now)
            expires = row["lock_expires"]
            if row["lock_owner"] not in (None, owner) and expires is not None and expires > now:
                ttl_ms = max(1, math.ceil((expires - now) * 1000))
                raise LeaseHeld(
                    f"leased by {row['lock_owner']!r} for another {ttl_ms} ms; another worker "
                    "drives this thread: leave it, recovery re-sends it if that worker dies",
                    thread_id=thread_id,
                    ttl_ms=ttl_ms,
                )
            token: int = row["fence"] + 1
            db.execute(
                "UPDATE threads SET fence = ?, lock_owner = ?, lock_token = ?, lock_expires = ? "
                "WHERE thread_id = ?",
                (token, owner, token, now + ttl, thread_id),
            )
            if Status(row["status"]).is_live:
                db.execute(
                    "UPDATE threads SET status = ?, due_at = ?, updated_at = ? WHERE thread_id = ?",
                    (Status.RUNNING.value, now + ttl, now, thread_id),
                )
            return token

    def _do_renew(self, thread_id: str, owner: str, token: int, ttl: float) -> None:
        with self._write() as db:
            now = time.time()
            changed = db.execute(
                "UPDATE threads SET lock_expires = ?1, due_at = CASE WHEN status = ?2 "
                "THEN ?1 ELSE due_at END WHERE thread_id = ?3 AND lock_owner = ?4 "
                "AND lock_token = ?5 AND lock_expires > ?6",
                (now + ttl, Status.RUNNING.value, thread_id, owner, token, now),
            ).rowcount
            if not changed:
                raise LeaseLost(
                    f"the lease of {owner!r} with token {token} expired or passed to another "
                    "worker; stop driving this thread, its new driver resumes it",
                    thread_id=thread_id,
                )

    def _do_release(self, thread_id: str, owner: str, token: int) -> bool:
        with self._write() as db:
            return _release(db, thread_id, owner, token, live_at=time.time())

    # -- checkpoints ---------------------------------------------------------------------

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
            extra["result"] = _value(result, "result", thread_id, step)
        pause = None if interrupt is UNSET else _value(interrupt, "interrupt", thread_id, step)
        with self._write() as db:
            row = self._fenced(db, thread_id, token)
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
            if not isinstance(due_in, _Unset):
                extra["due_at"] = None if due_in is None else now + due_in
            # The driver has acted on the resume value and interrupt it read: they are spent.
            _update(
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
                interrupt=pause,
                **extra,
            )
            if release_owner is not None:
                _release(db, thread_id, release_owner, token)
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
    ) -> None:
        values: dict[str, Any] = {"status": Status(status).value}
        for name, value in (("error", error), ("attempts", attempts), ("crashes", crashes)):
            if value is not UNSET:
                values[name] = value
        for name, value in (("result", result), ("interrupt", interrupt)):
            if value is not UNSET:
                values[name] = _value(value, name, thread_id, None)
        with self._write() as db:
            self._fenced(db, thread_id, token)
            now = time.time()
            if due_in is not None and values["status"] == Status.RETRYING.value:
                values["retry_at"] = now + due_in  # acquire() refuses the thread until then
            _update(db, thread_id, now, due_at=None if due_in is None else now + due_in, **values)
            if release_owner is not None:
                _release(db, thread_id, release_owner, token)

    def _do_latest(self, thread_id: str) -> Checkpoint | None:
        with self._locked() as db:
            row = db.execute(
                "SELECT c.step, c.data FROM threads t JOIN checkpoints c "
                "ON c.thread_id = t.thread_id AND c.step = t.step WHERE t.thread_id = ?",
                (thread_id,),
            ).fetchone()
            return None if row is None else _load(db, thread_id, row[0], row[1])

    def _do_checkpoint(self, thread_id: str, step: int) -> Checkpoint:
        with self._locked() as db:
            row = db.execute(
                "SELECT data FROM checkpoints WHERE thread_id = ? AND step = ?", (thread_id, step)
            ).fetchone()
            if row is None:
                raise _checkpoint_not_found(thread_id, step, self.keep_last)
            return _load(db, thread_id, step, row[0])

    def _do_history(self, thread_id: str, *, before: int | None, limit: int) -> list[Checkpoint]:
        with self._locked() as db:
            rows = db.execute(
                "SELECT step, data FROM checkpoints WHERE thread_id = ? AND step < ? "
                "ORDER BY step DESC LIMIT ?",
                (thread_id, math.inf if before is None else before, limit),
            ).fetchall()
            return [_load(db, thread_id, step, data) for step, data in rows]

    # -- effects -------------------------------------------------------------------------

    def _do_claim_effect(
        self,
        thread_id: str,
        key: str,
        token: int,
        *,
        shared: bool,
        takeover: bool,
        claim_id: str,
    ) -> Claim:
        scope = "" if shared else thread_id
        with self._write() as db:
            self._fenced(db, thread_id, token)
            found = _read_effect(db, thread_id, scope, key)
            resent = (
                found is not None
                and found.state == "pending"
                and claim_id != ""
                and (found.token == token and _claim_of(db, scope, key) == claim_id)
            )
            if found is None or (found.state == "pending" and takeover) or resent:
                db.execute(
                    'INSERT OR REPLACE INTO effects (scope, "key", state, token, claim) '
                    "VALUES (?, ?, 'pending', ?, ?)",
                    (scope, key, token, claim_id),
                )
                return Claim("claimed", Effect(key, "pending", token))
        return Claim("done" if found.state == "done" else "unknown", found)

    def _do_complete_effect(
        self, thread_id: str, key: str, token: int, result: Any, *, shared: bool
    ) -> None:
        data = _value(result, f"effect {key!r} result", thread_id, None)
        scope = "" if shared else thread_id
        with self._write() as db:
            self._fenced(db, thread_id, token)
            found = _read_effect(db, thread_id, scope, key)
            if found is None:
                raise EffectError(
                    f"effect {key!r} has no record to complete; claim it with claim_effect() "
                    "before running the effect",
                    thread_id=thread_id,
                )
            if (
                found.state == "done"
                and found.token == token
                and _stored_result(db, scope, key) == data
            ):
                return  # the same completion again: nothing to change
            if found.state != "pending" or found.token != token:
                raise StaleToken(
                    f"effect {key!r} is {found.state} under token {found.token}, not claimed by "
                    f"token {token}; another driver took it over: do not record this result",
                    thread_id=thread_id,
                )
            db.execute(
                "UPDATE effects SET state = 'done', result = ?, claim = NULL "
                'WHERE scope = ? AND "key" = ?',
                (data, scope, key),
            )

    def _do_release_effect(
        self, thread_id: str, key: str, token: int, *, claim_id: str, shared: bool
    ) -> None:
        scope = "" if shared else thread_id
        with self._write() as db:
            self._fenced(db, thread_id, token)
            found = db.execute(
                'SELECT state, token, claim FROM effects WHERE scope = ? AND "key" = ?',
                (scope, key),
            ).fetchone()
            if found is None:
                return  # already dropped: the same release again
            if (found["state"], found["token"], found["claim"]) != ("pending", token, claim_id):
                raise StaleToken(
                    f"effect {key!r} is {found['state']} under token {found['token']}, not "
                    f"this claim of token {token}; another driver took it over: leave it",
                    thread_id=thread_id,
                )
            db.execute('DELETE FROM effects WHERE scope = ? AND "key" = ?', (scope, key))

    def _do_effect(self, thread_id: str, key: str, *, shared: bool) -> Effect | None:
        with self._locked() as db:
            return _read_effect(db, thread_id, "" if shared else thread_id, key)

    # -- recovery ------------------------------------------------------------------------

    def due(self, *, limit: int = 100) -> list[tuple[str, float]]:
        with self._locked() as db:
            return _due(db, time.time(), limit)

    def claim_due(self, *, hold: float, limit: int = 100) -> list[str]:
        with self._write() as db:
            now = time.time()
            ids = [thread_id for thread_id, _ in _due(db, now, limit)]
            db.execute(
                f"UPDATE threads SET due_at = ? WHERE thread_id IN ({_marks(ids)})",
                (now + hold, *ids),
            )
        return ids

    def _do_lease_sweeper(self, owner: str, ttl: float) -> bool:
        with self._write() as db:
            now = time.time()
            row = db.execute("SELECT owner, expires FROM leases WHERE name = 'sweeper'").fetchone()
            if row is not None and row["owner"] != owner and row["expires"] > now:
                return False
            db.execute(
                "INSERT OR REPLACE INTO leases (name, owner, expires) VALUES ('sweeper', ?, ?)",
                (owner, now + ttl),
            )
            return True

    # -- operations ----------------------------------------------------------------------

    def check(self) -> list[Finding]:
        with self._locked() as db:
            (mode,) = db.execute("PRAGMA journal_mode").fetchone()
            (sync,) = db.execute("PRAGMA synchronous").fetchone()
        findings = []
        if str(mode).lower() != "wal":
            findings.append(
                Finding(
                    "journal_mode",
                    str(mode),
                    "without WAL, readers block writers and workers time out under load.",
                    f"put {self.path!r} on a local filesystem that supports WAL (not NFS/SMB).",
                )
            )
        if sync < 2:  # FULL (2) or EXTRA (3) fsync every commit
            findings.append(
                Finding(
                    "synchronous",
                    str(sync),
                    "commits may be acknowledged before they reach the disk and be lost.",
                    "run PRAGMA synchronous=FULL on every connection (agentq does).",
                )
            )
        return findings

    def close(self) -> None:
        self._after_fork()
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def graph(self) -> SQLiteGraph:
        return SQLiteGraph(self.path, connection=self._locked, transaction=self._write)


@contextmanager
def immediate_transaction(db: sqlite3.Connection) -> Iterator[None]:
    # IMMEDIATE takes the write lock up front: a deferred transaction that later tries to
    # write can fail with SQLITE_BUSY without the busy timeout ever applying.
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def _marks(values: list[Any]) -> str:
    return ", ".join("?" * len(values))


def _value(value: Any, what: str, thread_id: str, step: int | None) -> bytes:
    return encode_value(value, what=what, thread_id=thread_id, step=step)


def _status(db: sqlite3.Connection, thread_id: str) -> Status:
    row = db.execute("SELECT status FROM threads WHERE thread_id = ?", (thread_id,)).fetchone()
    if row is None:
        raise ThreadNotFound(_NOT_FOUND, thread_id=thread_id)
    return Status(row[0])


def _read_meta(db: sqlite3.Connection, thread_id: str) -> ThreadMeta | None:
    row = db.execute(
        f"SELECT {_META_COLUMNS} FROM threads WHERE thread_id = ?", (thread_id,)
    ).fetchone()
    return None if row is None else meta_from_fields(thread_id, dict(row))


def _read_effect(db: sqlite3.Connection, thread_id: str, scope: str, key: str) -> Effect | None:
    row = db.execute(
        'SELECT state, token, result FROM effects WHERE scope = ? AND "key" = ?', (scope, key)
    ).fetchone()
    if row is None:
        return None
    result = row["result"]
    if result is not None:
        result = decode_value(result, what=f"effect {key!r}", thread_id=thread_id, step=None)
    return Effect(key, row["state"], row["token"], result)


def _update(db: sqlite3.Connection, thread_id: str, now: float, **values: Any) -> None:
    columns = "".join(f'"{name}" = ?, ' for name in values)
    db.execute(
        f"UPDATE threads SET {columns}updated_at = ? WHERE thread_id = ?",
        (*values.values(), now, thread_id),
    )


def _release(
    db: sqlite3.Connection, thread_id: str, owner: str, token: int, *, live_at: float = -math.inf
) -> bool:
    """Clear the lease if ``owner`` holds it with ``token`` and it is live at ``live_at``."""
    cursor = db.execute(
        "UPDATE threads SET lock_owner = NULL, lock_token = NULL, lock_expires = NULL "
        "WHERE thread_id = ? AND lock_owner = ? AND lock_token = ? AND lock_expires > ?",
        (thread_id, owner, token, live_at),
    )
    return cursor.rowcount == 1


def _delete(db: sqlite3.Connection, thread_ids: list[str]) -> int:
    marks = _marks(thread_ids)
    db.execute(f"DELETE FROM checkpoints WHERE thread_id IN ({marks})", thread_ids)
    db.execute(f"DELETE FROM effects WHERE scope IN ({marks})", thread_ids)
    db.execute(f"DELETE FROM artifacts WHERE thread_id IN ({marks})", thread_ids)
    db.execute(f"DELETE FROM logs WHERE thread_id IN ({marks})", thread_ids)
    return db.execute(f"DELETE FROM threads WHERE thread_id IN ({marks})", thread_ids).rowcount


def _due(db: sqlite3.Connection, now: float, limit: int) -> list[tuple[str, float]]:
    rows = db.execute(
        "SELECT thread_id, due_at FROM threads WHERE due_at IS NOT NULL AND due_at <= ? "
        "ORDER BY due_at, thread_id LIMIT ?",
        (now, limit),
    ).fetchall()
    return [(row[0], row[1]) for row in rows]


def _checkpoint_not_found(thread_id: str, step: int, keep_last: int) -> CheckpointNotFound:
    return CheckpointNotFound(
        f"checkpoint {step} was never written or was pruned (the last {keep_last} are kept); "
        "list the stored steps with history(), or raise keep_last to keep more",
        thread_id=thread_id,
        step=step,
    )


def _stored_checkpoint(db: sqlite3.Connection, thread_id: str, step: int) -> bytes | None:
    row = db.execute(
        "SELECT data FROM checkpoints WHERE thread_id = ? AND step = ?", (thread_id, step)
    ).fetchone()
    return None if row is None else bytes(row[0])


def _stored_result(db: sqlite3.Connection, scope: str, key: str) -> bytes | None:
    row = db.execute(
        'SELECT result FROM effects WHERE scope = ? AND "key" = ?', (scope, key)
    ).fetchone()
    return None if row is None or row[0] is None else bytes(row[0])


def _append_log(
    db: sqlite3.Connection, thread_id: str, step: int, field: str, before: int, items: list[bytes]
) -> None:
    (length,) = db.execute(
        "SELECT COUNT(*) FROM logs WHERE thread_id = ? AND field = ?", (thread_id, field)
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


def _claim_of(db: sqlite3.Connection, scope: str, key: str) -> str | None:
    row = db.execute(
        'SELECT claim FROM effects WHERE scope = ? AND "key" = ?', (scope, key)
    ).fetchone()
    return None if row is None else row[0]
