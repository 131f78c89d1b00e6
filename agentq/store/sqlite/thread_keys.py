"""The embedded store's concurrency keys: the same slots and queues as Redis, each
operation in one write transaction."""

from __future__ import annotations

import sqlite3
import time

from agentq.errors import ThreadStateError
from agentq.records import LIVE, Status
from agentq.store.contract.thread_keys import CANCEL_REQUESTED, KeyState, KeyWaiter
from agentq.store.sqlite.connection import SharedConnection
from agentq.store.sqlite.queries import fenced, marks, release_lease, status_of, update

_LIVE = sorted(status.value for status in LIVE)

# A slot is live while the lease owning it lasts, or, reserved (no token) for a woken
# thread, while that thread may still start.
_LIVE_SLOT = (
    "SELECT s.thread_id FROM key_slots s LEFT JOIN threads t ON t.thread_id = s.thread_id "
    'WHERE s."key" = ? AND ((s.token IS NOT NULL AND t.lock_token = s.token AND '
    f"t.lock_expires > ?) OR (s.token IS NULL AND t.status IN ({marks(_LIVE)})))"
)


def _live(db: sqlite3.Connection, key: str, now: float) -> list[str]:
    return [row[0] for row in db.execute(_LIVE_SLOT, (key, now, *_LIVE))]


def _reclaim(db: sqlite3.Connection, key: str, now: float) -> int:
    """Drop the dead slots of ``key``; return how many are live."""
    live = _live(db, key, now)
    db.execute(
        f'DELETE FROM key_slots WHERE "key" = ? AND thread_id NOT IN ({marks(live)})',
        (key, *live),
    )
    return len(live)


def _wake(db: sqlite3.Connection, key: str, now: float, grace: float) -> list[str]:
    """Wake waiters of ``key``, first parked first, while slots are free (as
    ``_thread_keys_prelude.lua``'s ``wake``)."""
    row = db.execute('SELECT cap FROM key_caps WHERE "key" = ?', (key,)).fetchone()
    cap, live, woken = (row[0] if row else 1), _reclaim(db, key, now), []
    while live < cap:
        first = db.execute(
            "SELECT w.thread_id, t.status FROM key_waiters w LEFT JOIN threads t "
            'ON t.thread_id = w.thread_id WHERE w."key" = ? ORDER BY w.seq LIMIT 1',
            (key,),
        ).fetchone()
        if first is None:
            break
        thread_id, status = first
        db.execute("DELETE FROM key_waiters WHERE thread_id = ?", (thread_id,))
        if status is None or Status(status) not in LIVE:
            continue
        db.execute(
            'INSERT OR REPLACE INTO key_slots ("key", thread_id, token) VALUES (?, ?, NULL)',
            (key, thread_id),
        )
        if status == Status.QUEUED.value:
            db.execute(
                "UPDATE threads SET due_at = ? WHERE thread_id = ?", (now + grace, thread_id)
            )
        live += 1
        woken.append(thread_id)
    (held,) = db.execute('SELECT COUNT(*) FROM key_slots WHERE "key" = ?', (key,)).fetchone()
    (waiting,) = db.execute('SELECT COUNT(*) FROM key_waiters WHERE "key" = ?', (key,)).fetchone()
    if not held and not waiting:
        db.execute('DELETE FROM key_caps WHERE "key" = ?', (key,))
    return woken


class ThreadKeysMixin:
    """The concurrency-key operations of :class:`~agentq.store.sqlite.store.SQLiteStore`."""

    _conn: SharedConnection

    def _do_enter_key(self, thread_id: str, owner: str, token: int, key: str, cap: int) -> int:
        with self._conn.write() as db:
            now = time.time()
            asked_to_cancel = bool(fenced(db, thread_id, token)["cancel"])
            status = status_of(db, thread_id)
            if status != Status.RUNNING:  # parking a stopped thread would queue it again
                raise ThreadStateError(
                    f"the thread is {status.value}, which does not allow this; see it with "
                    f"'agentq show {thread_id}' (task.thread in code)",
                    thread_id=thread_id,
                    status=status.value,
                )
            if asked_to_cancel:  # as enter_key.lua: its driver cancels it, it never waits
                return CANCEL_REQUESTED
            db.execute('INSERT OR REPLACE INTO key_caps ("key", cap) VALUES (?, ?)', (key, cap))
            db.execute(  # counted with the key's takes: doctor sees a threads-only limit used
                'INSERT INTO limit_takes ("key", takes) VALUES (?, 1) '
                'ON CONFLICT("key") DO UPDATE SET takes = takes + 1',
                (key,),
            )
            seat = ('INSERT OR REPLACE INTO key_slots ("key", thread_id, token) VALUES (?, ?, ?)',)
            held = db.execute(
                'SELECT 1 FROM key_slots WHERE "key" = ? AND thread_id = ?', (key, thread_id)
            ).fetchone()
            if held is not None:
                db.execute(*seat, (key, thread_id, token))
                return 0
            free = cap - _reclaim(db, key, now)
            order = [
                row[0]
                for row in db.execute(
                    'SELECT thread_id FROM key_waiters WHERE "key" = ? ORDER BY seq', (key,)
                )
            ]
            rank = order.index(thread_id) if thread_id in order else None
            if free > 0 and ((rank is None and not order) or (rank is not None and rank < free)):
                db.execute("DELETE FROM key_waiters WHERE thread_id = ?", (thread_id,))
                db.execute(*seat, (key, thread_id, token))
                return 0
            if rank is None:
                db.execute(
                    'INSERT INTO key_waiters ("key", thread_id, since) VALUES (?, ?, ?)',
                    (key, thread_id, now),
                )
                rank = len(order)
            update(db, thread_id, now, status=Status.QUEUED.value, due_at=None)
            release_lease(db, thread_id, owner, token)
            return rank + 1

    def _do_leave_key(
        self, thread_id: str, token: int, key: str, start_grace: float, cap: int | None
    ) -> list[str]:
        with self._conn.write() as db:
            db.execute(
                'DELETE FROM key_slots WHERE "key" = ? AND thread_id = ? AND token = ?',
                (key, thread_id, token),
            )
            if cap is not None:  # declared now: as in leave_key.lua, a raised cap wakes more
                db.execute('INSERT OR REPLACE INTO key_caps ("key", cap) VALUES (?, ?)', (key, cap))
            return _wake(db, key, time.time(), start_grace)

    def wake_keys(self) -> list[str]:
        with self._conn.locked() as db:  # every sweep asks: no write lock when idle
            if db.execute("SELECT 1 FROM key_caps LIMIT 1").fetchone() is None:
                return []
        with self._conn.write() as db:
            now = time.time()
            keys = [row[0] for row in db.execute('SELECT "key" FROM key_caps ORDER BY "key"')]
            return [woken for key in keys for woken in _wake(db, key, now, 0)]

    def key_states(self) -> list[KeyState]:
        with self._conn.locked() as db:
            now = time.time()
            states = []
            for key, cap in db.execute('SELECT "key", cap FROM key_caps ORDER BY "key"').fetchall():
                waiting = [
                    KeyWaiter(thread_id, position, since)
                    for position, (thread_id, since) in enumerate(
                        db.execute(
                            'SELECT thread_id, since FROM key_waiters WHERE "key" = ? ORDER BY seq',
                            (key,),
                        ),
                        start=1,
                    )
                ]
                states.append(KeyState(key, cap, sorted(_live(db, key, now)), waiting))
            return states
