"""The embedded store's leases and recovery: who drives a thread, with which fencing token,
and which threads are due (a lease run out, a retry's time, a wait's timeout)."""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Sequence

from agentq.errors import LeaseHeld, LeaseLost, ThreadNotFound
from agentq.records import Status
from agentq.store.contract import Renewal, Taken, retry_not_due
from agentq.store.contract.leases import RESEND_SPACING_CAP
from agentq.store.sqlite.connection import SharedConnection
from agentq.store.sqlite.queries import (
    NOT_FOUND,
    due_rows,
    encode,
    marks,
    read_meta,
    release_lease,
    update,
)


class LeasesMixin:
    """The lease and recovery operations of :class:`~agentq.store.sqlite.store.SQLiteStore`."""

    _conn: SharedConnection

    # -- lease ---------------------------------------------------------------------------

    def _do_acquire(self, thread_id: str, owner: str, ttl: float) -> int:
        with self._conn.write() as db:
            token, _ = _acquire(db, thread_id, owner, ttl, only_runnable=False)
        assert token is not None
        return token

    def _do_acquire_to_run(self, thread_id: str, owner: str, ttl: float) -> Taken:
        with self._conn.write() as db:
            token, lost = _acquire(db, thread_id, owner, ttl, only_runnable=True)
            meta = read_meta(db, thread_id)
        assert meta is not None  # the transaction that read it holds it
        return Taken(meta, token, lost)

    def _do_renew(self, thread_id: str, owner: str, token: int, ttl: float) -> None:
        if not self._do_renew_many([Renewal(thread_id, owner, token, ttl)])[0]:
            raise LeaseLost(
                f"the lease of {owner!r} with token {token} expired or passed to another "
                "worker; stop driving this thread, its new driver resumes it",
                thread_id=thread_id,
            )

    def _do_renew_many(self, leases: Sequence[Renewal]) -> list[bool]:
        with self._conn.write() as db:  # one transaction, one fsync, for all of them
            now = time.time()
            return [
                # Named, not numbered (?1): Python 3.12.0 to 3.12.3 take ?1 for a name and
                # warn (DeprecationWarning) at every renewal bound from a sequence.
                db.execute(
                    "UPDATE threads SET lock_expires = :expires, due_at = CASE WHEN status = "
                    ":running THEN :expires ELSE due_at END WHERE thread_id = :thread_id AND "
                    "lock_owner = :owner AND lock_token = :token AND lock_expires > :now",
                    {
                        "expires": now + lease.ttl,
                        "running": Status.RUNNING.value,
                        "thread_id": lease.thread_id,
                        "owner": lease.owner,
                        "token": lease.token,
                        "now": now,
                    },
                ).rowcount
                == 1
                for lease in leases
            ]

    def _do_release(self, thread_id: str, owner: str, token: int) -> bool:
        with self._conn.write() as db:
            return release_lease(db, thread_id, owner, token, live_at=time.time())

    # -- recovery ------------------------------------------------------------------------

    def due(self, *, limit: int = 100) -> list[tuple[str, float]]:
        with self._conn.locked() as db:
            return due_rows(db, time.time(), limit)

    def claim_due(self, *, hold: float, limit: int = 100) -> list[str]:
        with self._conn.write() as db:
            now = time.time()
            ids = [thread_id for thread_id, _ in due_rows(db, now, limit)]
            db.execute(
                f"UPDATE threads SET due_at = ? WHERE thread_id IN ({marks(ids)})",
                (now + hold, *ids),
            )
        return ids

    def _do_unclaim_due(self, thread_ids: Sequence[str]) -> None:
        ids = list(thread_ids)
        with self._conn.write() as db:
            now = time.time()
            db.execute(
                f"UPDATE threads SET due_at = ? WHERE due_at > ? AND thread_id IN ({marks(ids)})",
                (now, now, *ids),
            )

    def _do_defer_due(self, thread_id: str, fence: int, hold: float) -> None:
        with self._conn.write() as db:
            now = time.time()
            db.execute(
                "UPDATE threads SET due_at = ? + MIN(? - updated_at, ?) WHERE thread_id = ? "
                "AND status = ? AND fence = ? AND due_at IS NOT NULL AND ? - updated_at > ?",
                (
                    now,
                    now,
                    RESEND_SPACING_CAP * hold,
                    thread_id,
                    Status.QUEUED.value,
                    fence,
                    now,
                    2 * hold,
                ),
            )

    def _do_lease_sweeper(self, owner: str, ttl: float) -> bool:
        with self._conn.write() as db:
            now = time.time()
            row = db.execute("SELECT owner, expires FROM leases WHERE name = 'sweeper'").fetchone()
            if row is not None and row["owner"] != owner and row["expires"] > now:
                return False
            db.execute(
                "INSERT OR REPLACE INTO leases (name, owner, expires) VALUES ('sweeper', ?, ?)",
                (owner, now + ttl),
            )
            return True


def _acquire(
    db: sqlite3.Connection, thread_id: str, owner: str, ttl: float, *, only_runnable: bool
) -> tuple[int | None, bool]:
    """Take the lease inside the caller's write transaction: the new token, or ``None``
    for a thread that does not run by itself, left unleased when ``only_runnable`` (a
    driver about to run it); and whether it counted a lost worker, as it does for a driver
    taking a thread running under no live lease of ``owner``."""
    now = time.time()
    row = db.execute(
        "SELECT status, fence, lock_owner, lock_expires, lock_lost, retry_at, timeout_at, "
        "interrupt FROM threads WHERE thread_id = ?",
        (thread_id,),
    ).fetchone()
    if row is None:
        raise ThreadNotFound(NOT_FOUND, thread_id=thread_id)
    status = Status(row["status"])
    timed_out = status == Status.WAITING and row["timeout_at"] is not None
    if only_runnable and not (status.is_live or timed_out):
        return None, False
    if status == Status.RETRYING and (row["retry_at"] or 0) > now:
        raise retry_not_due(thread_id, row["retry_at"] - now)
    if timed_out and row["timeout_at"] > now:
        raise retry_not_due(thread_id, row["timeout_at"] - now)
    expires = row["lock_expires"]
    locked = expires is not None and expires > now
    if row["lock_owner"] not in (None, owner) and locked:
        ttl_ms = max(1, math.ceil((expires - now) * 1000))
        raise LeaseHeld(
            f"leased by {row['lock_owner']!r} for another {ttl_ms} ms; another worker "
            "drives this thread: leave it, recovery re-sends it if that worker dies",
            thread_id=thread_id,
            ttl_ms=ttl_ms,
        )
    # Running under no live lease of this owner: its worker was lost at this step. Asked
    # again after a lost reply, this owner finds the lease of the take that counted it,
    # and says so again without counting it twice.
    own = row["lock_owner"] == owner and locked
    running = only_runnable and status == Status.RUNNING
    counts = running and not own
    lost = running and (not own or bool(row["lock_lost"]))
    token: int = row["fence"] + 1
    db.execute(
        "UPDATE threads SET fence = ?, lock_owner = ?, lock_token = ?, lock_expires = ?, "
        "lock_lost = ? WHERE thread_id = ?",
        (token, owner, token, now + ttl, int(lost), thread_id),
    )
    if timed_out:  # the node that runs next gets the unanswered question
        asked = row["interrupt"] or encode(None, "interrupt", thread_id, None)
        update(db, thread_id, now, timeout_at=None, timed_out=asked)
    if status.is_live or timed_out:
        db.execute(
            "UPDATE threads SET status = ?, due_at = ?, updated_at = ?, crashes = crashes + ? "
            "WHERE thread_id = ?",
            (Status.RUNNING.value, now + ttl, now, int(counts), thread_id),
        )
    return token, lost
