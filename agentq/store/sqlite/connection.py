"""The embedded store's connection: one per process, shared by its threads, safe across fork.

Every write is one ``BEGIN IMMEDIATE`` transaction, so SQLite's write lock serialises it
against every other process and it commits whole or not at all. The database runs in WAL
mode with ``synchronous=FULL``: a commit that returned is on disk before the caller
acknowledges the step.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from agentq.errors import StoreConfigError
from agentq.records import Finding
from agentq.store.sqlite.schema import migrate, needs_migration

BUSY_TIMEOUT: Final = 30.0
"""Seconds a write waits for another process's transaction before giving up."""

_BUSY_SLEEPS: Final = (0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.025, 0.025, 0.05, 0.05)
"""SQLite's own busy handler's sleeps between tries, in seconds; 0.1 after them."""

_PASSING_ERRORS: Final = frozenset(
    {
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_CANTOPEN,
    }
)
"""Primary result codes of errors that pass: another process's lock, the disk."""


def passes(exc: BaseException) -> bool:
    """Whether ``exc`` is a store outage that passes: "database is locked" past the busy
    timeout, or the disk failing, full or gone."""
    code = getattr(exc, "sqlite_errorcode", None)  # absent on one raised by hand
    return isinstance(exc, sqlite3.OperationalError) and (
        code is None or code & 0xFF in _PASSING_ERRORS
    )


def _begin_immediate(db: sqlite3.Connection) -> None:
    # The wait for another process's write lock sleeps here rather than in SQLite's busy
    # handler: time.sleep lets a gevent worker's other greenlets (model calls, the lease
    # keeper, the broker's heartbeats) run meanwhile, where SQLite's sleep would stop them
    # all. The connection's busy timeout is 0, so every try returns at once.
    deadline = time.monotonic() + BUSY_TIMEOUT
    for pause in itertools.chain(_BUSY_SLEEPS, itertools.repeat(0.1)):
        try:
            db.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as exc:
            busy = getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_BUSY
            if not busy or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)


@contextmanager
def immediate_transaction(db: sqlite3.Connection) -> Iterator[None]:
    # IMMEDIATE takes the write lock up front: a deferred transaction that later tries to
    # write can fail with SQLITE_BUSY without any wait for the lock.
    try:
        # Inside the try: an exception a signal handler raises (Celery's soft time limit)
        # just after BEGIN returned must roll back, not leave the write lock taken.
        _begin_immediate(db)
        yield
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


_shared: weakref.WeakSet[SharedConnection] = weakref.WeakSet()
"""Every process's open connections, so that no fork lands inside one's transaction."""
_held_for_fork: list[threading.Lock] = []


def _hold_for_fork() -> None:
    # No connection may cross fork(): SQLite keeps a file's locks per process, so a child's
    # own connection would share what it inherited and take no lock of its own (fcntl
    # locks stay with the parent). Once the parent died, a process closing the database
    # would find no other user and delete the WAL the child goes on committing to. So
    # each is closed, after the transaction a parent thread may be in, and opened again on
    # next use. Bounded, in case the forking thread is the one writing.
    for shared in list(_shared):
        if shared._lock.acquire(timeout=BUSY_TIMEOUT):
            _held_for_fork.append(shared._lock)
            shared._close_for_fork()


def _release_after_fork() -> None:
    while _held_for_fork:
        _held_for_fork.pop().release()


os.register_at_fork(
    before=_hold_for_fork,
    after_in_parent=_release_after_fork,
    after_in_child=_release_after_fork,  # held by the forking thread, the child's only one
)


class SharedConnection:
    """One connection to ``path``, shared by the threads of a process under a lock (a
    heartbeat thread renews the lease while the task commits). It is closed before a
    ``fork()`` (Celery prefork) and each process opens its own on first use: SQLite
    connections must not cross it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._db: sqlite3.Connection | None = None
        # A connection inherited through fork() (one a parent thread held past the busy
        # timeout) is kept referenced, never closed: closing it in the child could run
        # SQLite's last-connection cleanup on the parent's WAL.
        self._inherited: list[sqlite3.Connection] = []
        _shared.add(self)

    @contextmanager
    def locked(self) -> Iterator[sqlite3.Connection]:
        """The connection, held by this thread alone until the block ends."""
        self._after_fork()
        with self._lock:
            if self._db is None:
                self._db = _connect(self.path)
            elif self._db.in_transaction:
                # Left open by a caller an exception interrupted where nothing could roll it
                # back: it would keep the write lock (or an old snapshot) for good.
                self._db.execute("ROLLBACK")
            yield self._db

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """The connection inside one read transaction: its statements see the database
        as one moment left it, whatever other processes commit meanwhile."""
        with self.locked() as db:
            try:
                db.execute("BEGIN")  # in the try, as immediate_transaction's
                yield db
            finally:
                if db.in_transaction:
                    db.execute("COMMIT")

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """The connection inside one write transaction, committed when the block ends."""
        with self.locked() as db:
            try:
                with immediate_transaction(db):
                    yield db
            except sqlite3.OperationalError as exc:
                # SQLite opens a file it may not write read-only, so this shows at a write.
                why = _code(exc) == sqlite3.SQLITE_READONLY and _why_unwritable(self.path)
                if why:
                    raise StoreConfigError(
                        f"cannot write SQLite store {self.path!r}: {why}"
                    ) from exc
                raise

    def close(self) -> None:
        self._after_fork()
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def _close_for_fork(self) -> None:
        # Under the lock, which the fork hook holds.
        if self._db is not None and self._pid == os.getpid():
            self._db.close()
            self._db = None

    def _after_fork(self) -> None:
        if self._pid != os.getpid():
            # The lock may have been held by a parent thread that does not exist here.
            self._lock = threading.Lock()
            if self._db is not None:
                self._inherited.append(self._db)
            self._db, self._pid = None, os.getpid()


def _connect(path: str) -> sqlite3.Connection:
    try:
        db = sqlite3.connect(
            path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False
        )
    except sqlite3.Error as exc:
        raise StoreConfigError(
            f"cannot open SQLite store {path!r} ({exc}); check the path and that "
            "this user may read and write it"
        ) from exc
    db.row_factory = sqlite3.Row
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        # From here on only _begin_immediate waits for a lock. In WAL mode a read meets one
        # only while another connection rebuilds the log's index after a crash, for
        # moments; it then fails as a transient store error.
        db.execute("PRAGMA busy_timeout=0")
        # Only a database to create or migrate takes the write lock: opening one is a read,
        # which another process's long write does not hold up.
        if needs_migration(db):
            with immediate_transaction(db):
                migrate(db, path)
    except sqlite3.DatabaseError as exc:
        db.close()
        # Another process's lock or the disk passes; a file it cannot open is set up wrong.
        if passes(exc) and _code(exc) != sqlite3.SQLITE_CANTOPEN:
            raise
        why = _why_unwritable(path)
        raise StoreConfigError(
            f"cannot use SQLite store {path!r} ({exc}); "
            + (
                why
                or "check that it is an agentq database on a local disk and that no "
                "process keeps it locked"
            )
        ) from exc
    except BaseException:
        db.close()
        raise
    return db


def _code(exc: sqlite3.Error) -> int:
    """The primary result code of ``exc``; 0 for one raised by hand."""
    code: int = getattr(exc, "sqlite_errorcode", 0)
    return code & 0xFF


def _why_unwritable(path: str) -> str | None:
    """Why this process may not write the store's file, or create the -wal and -shm files
    SQLite keeps beside it, naming the fix; ``None`` if nothing here says it may not."""
    directory = os.path.dirname(path)
    try:
        read_only = os.statvfs(directory).f_flag & os.ST_RDONLY
    except OSError:
        return None
    if read_only:
        return (
            f"{directory!r} is on a read-only mount, and every step is written to the "
            "store: mount it read-write"
        )
    for target in (path, directory):  # the directory: SQLite creates its -wal and -shm there
        if os.path.exists(target) and not os.access(target, os.W_OK):
            return f"this user may not write {target!r}: give it write permission"
    return None


def durability_findings(db: sqlite3.Connection, path: str) -> list[Finding]:
    """What ``agentq doctor`` reports about the connection's journal and sync settings."""
    (mode,) = db.execute("PRAGMA journal_mode").fetchone()
    (sync,) = db.execute("PRAGMA synchronous").fetchone()
    findings = []
    if str(mode).lower() != "wal":
        findings.append(
            Finding(
                "journal_mode",
                str(mode),
                "without WAL, readers block writers and workers time out under load.",
                f"put {path!r} on a local filesystem that supports WAL (not NFS/SMB).",
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
