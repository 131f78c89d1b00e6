"""The embedded store's idempotency records of tool calls and other side effects."""

from __future__ import annotations

import math
import sqlite3
import time
from typing import Any

from agentq.codec.envelope import decode_value
from agentq.errors import EffectError, StaleToken, ThreadNotFound
from agentq.records import Claim, ClaimOutcome, Effect, EffectState, Status, ThreadMeta
from agentq.store.contract.effects import (
    RESOLVABLE,
    claimant_holds,
    held_while_resolving,
    not_resolvable,
    status_not_resolvable,
)
from agentq.store.sqlite.connection import SharedConnection
from agentq.store.sqlite.queries import NOT_FOUND, encode, fenced, read_meta, update


class EffectsMixin:
    """The effect operations of :class:`~agentq.store.sqlite.store.SQLiteStore`."""

    _conn: SharedConnection

    def _do_claim_effect(
        self,
        thread_id: str,
        key: str,
        token: int,
        *,
        shared: bool,
        takeover: bool,
        claim_id: str,
        tool: str,
    ) -> Claim:
        scope = "" if shared else thread_id
        with self._conn.write() as db:
            fenced(db, thread_id, token)
            found = _read_effect(db, thread_id, scope, key)
            resent = (
                found is not None
                and found.state == EffectState.PENDING
                and claim_id != ""
                and (found.token == token and _claim_of(db, scope, key) == claim_id)
            )
            if found is None or (found.state == EffectState.PENDING and takeover) or resent:
                db.execute(
                    'INSERT OR REPLACE INTO effects (scope, "key", state, token, claim, tool, '
                    "claimed_at, claimed_by) VALUES (?, ?, 'pending', ?, ?, ?, ?, ?)",
                    (scope, key, token, claim_id, tool or None, time.time(), thread_id),
                )
                return Claim(ClaimOutcome.CLAIMED, Effect(key, EffectState.PENDING, token))
        done = found.state == EffectState.DONE
        return Claim(ClaimOutcome.DONE if done else ClaimOutcome.UNKNOWN, found)

    def _do_complete_effect(
        self, thread_id: str, key: str, token: int, result: Any, *, shared: bool
    ) -> None:
        data = encode(result, f"effect {key!r} result", thread_id, None)
        scope = "" if shared else thread_id
        with self._conn.write() as db:
            fenced(db, thread_id, token)
            found = _read_effect(db, thread_id, scope, key)
            if found is None:
                raise EffectError(
                    f"effect {key!r} has no record to complete; claim it with claim_effect() "
                    "before running the effect",
                    thread_id=thread_id,
                )
            # Tokens count per thread: a shared record's may be another thread's claim.
            mine = found.token == token and found.claimed_by in (None, thread_id)
            if found.state == EffectState.DONE and mine and _stored_result(db, scope, key) == data:
                return  # the same completion again: nothing to change
            if found.state != EffectState.PENDING or not mine:
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
        with self._conn.write() as db:
            fenced(db, thread_id, token)
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
        with self._conn.locked() as db:
            return _read_effect(db, thread_id, "" if shared else thread_id, key)

    def _do_effects(self, thread_id: str) -> list[Effect]:
        with self._conn.locked() as db:
            keys = db.execute('SELECT "key" FROM effects WHERE scope = ?', (thread_id,))
            found = [_read_effect(db, thread_id, thread_id, row[0]) for row in keys.fetchall()]
        return [effect for effect in found if effect is not None]

    def _do_resolve_effect(
        self,
        thread_id: str,
        key: str,
        *,
        result: Any,
        did_not_run: bool,
        start_grace: float,
        shared: bool,
    ) -> ThreadMeta:
        data = None if did_not_run else encode(result, f"effect {key!r} result", thread_id, None)
        scope = "" if shared else thread_id
        with self._conn.write() as db:
            now = time.time()
            row = db.execute(
                "SELECT status, fence, lock_owner, lock_expires FROM threads WHERE thread_id = ?",
                (thread_id,),
            ).fetchone()
            if row is None:
                raise ThreadNotFound(NOT_FOUND, thread_id=thread_id)
            if (ttl_ms := _lease_left(row, now)) is not None:
                raise held_while_resolving(thread_id, ttl_ms)
            if Status(row["status"]) not in RESOLVABLE:
                raise status_not_resolvable(thread_id, row["status"])
            found = _read_effect(db, thread_id, scope, key)
            if found is None or found.state != EffectState.PENDING:
                state = None if found is None else found.state
                raise not_resolvable(thread_id, key, state, shared=shared)
            if shared and found.claimed_by is not None:
                claimant = db.execute(
                    "SELECT lock_owner, lock_expires FROM threads WHERE thread_id = ?",
                    (found.claimed_by,),
                ).fetchone()
                if claimant is not None and (ttl_ms := _lease_left(claimant, now)) is not None:
                    raise claimant_holds(thread_id, key, found.claimed_by, ttl_ms)
            # A new fence: a worker frozen with the old token cannot record over this.
            fence = row["fence"] + 1
            if data is None:
                db.execute('DELETE FROM effects WHERE scope = ? AND "key" = ?', (scope, key))
            else:
                # Tokens count per thread: the new one is this thread's.
                db.execute(
                    "UPDATE effects SET state = 'done', token = ?, result = ?, claim = NULL, "
                    'claimed_by = ? WHERE scope = ? AND "key" = ?',
                    (fence, data, thread_id, scope, key),
                )
            update(
                db,
                thread_id,
                now,
                status=Status.QUEUED.value,
                fence=fence,
                error=None,
                attempts=0,
                crashes=0,
                cancel=0,
                reopened=1,
                due_at=now + start_grace,
            )
            meta = read_meta(db, thread_id)
        assert meta is not None
        return meta


def _lease_left(row: sqlite3.Row, now: float) -> int | None:
    """The milliseconds left of the lease a thread's row holds, ``None`` if none is live."""
    expires: float | None = row["lock_expires"]
    if row["lock_owner"] is None or expires is None or expires <= now:
        return None
    return max(1, math.ceil((expires - now) * 1000))


def _read_effect(db: sqlite3.Connection, thread_id: str, scope: str, key: str) -> Effect | None:
    row = db.execute(
        "SELECT state, token, result, tool, claimed_at, claimed_by FROM effects "
        'WHERE scope = ? AND "key" = ?',
        (scope, key),
    ).fetchone()
    if row is None:
        return None
    result = row["result"]
    if result is not None:
        result = decode_value(result, what=f"effect {key!r}", thread_id=thread_id, step=None)
    return Effect(
        key,
        EffectState(row["state"]),
        row["token"],
        result,
        tool=row["tool"],
        claimed_at=row["claimed_at"],
        # A thread's own records were claimed by it, whichever agentq wrote them.
        claimed_by=row["claimed_by"] if scope == "" else thread_id,
    )


def _stored_result(db: sqlite3.Connection, scope: str, key: str) -> bytes | None:
    row = db.execute(
        'SELECT result FROM effects WHERE scope = ? AND "key" = ?', (scope, key)
    ).fetchone()
    return None if row is None or row[0] is None else bytes(row[0])


def _claim_of(db: sqlite3.Connection, scope: str, key: str) -> str | None:
    row = db.execute(
        'SELECT claim FROM effects WHERE scope = ? AND "key" = ?', (scope, key)
    ).fetchone()
    return None if row is None else row[0]
