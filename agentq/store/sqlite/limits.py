"""The embedded store's rate limits: the same GCRA as Redis, in one write transaction."""

from __future__ import annotations

import time

from agentq.store.contract.limits import Grant, LimitState, Slot, Take
from agentq.store.sqlite.connection import SharedConnection
from agentq.store.sqlite.queries import marks


class LimitsMixin:
    """The limit operations of :class:`~agentq.store.sqlite.store.SQLiteStore`."""

    _conn: SharedConnection

    def take_limits(
        self, takes: list[Take], holder: str, ttl: float, reserve_within: float = 0
    ) -> Grant:
        with self._conn.write() as db:
            now = time.time()
            # As in Redis: a wait on the rate alone may be reserved, a pause or a full cap not.
            wait, blocked, plans = 0.0, 0.0, []
            for take in takes:
                limit = take.limit
                row = db.execute(
                    'SELECT req_tat, tok_tat, paused FROM limits WHERE "key" = ?', (take.key,)
                ).fetchone()
                req_tat, tok_tat, paused = row if row is not None else (0.0, 0.0, 0.0)
                blocked = max(blocked, paused - now)
                rpm, tpm = limit.requests_per_minute, limit.tokens_per_minute
                if rpm:
                    interval = 60 / rpm
                    req_tat = max(req_tat, now) + interval
                    wait = max(wait, req_tat - now - limit.request_burst * interval)
                if tpm:
                    tok_tat = max(tok_tat, now) + 60 / tpm * take.cost
                    wait = max(wait, tok_tat - now - 60)
                if limit.concurrency:
                    db.execute(
                        'DELETE FROM limit_holders WHERE "key" = ? AND expires <= ?',
                        (take.key, now),
                    )
                    (held,) = db.execute(
                        'SELECT COUNT(*) FROM limit_holders WHERE "key" = ? AND holder != ?',
                        (take.key, holder),
                    ).fetchone()
                    if held >= limit.concurrency:
                        blocked = max(blocked, 0.05)
                plans.append((take, req_tat, tok_tat, paused))
            if blocked > 1e-9 or wait > reserve_within + 1e-9:
                return Grant(False, max(wait, blocked))
            for take, req_tat, tok_tat, paused in plans:
                db.execute(
                    'INSERT OR REPLACE INTO limits ("key", req_tat, tok_tat, paused) '
                    "VALUES (?, ?, ?, ?)",
                    (take.key, req_tat, tok_tat, paused),
                )
                if take.limit.concurrency:
                    db.execute(
                        'INSERT OR REPLACE INTO limit_holders ("key", holder, expires) '
                        "VALUES (?, ?, ?)",
                        (take.key, holder, now + ttl),
                    )
                db.execute(
                    'INSERT INTO limit_takes ("key", takes) VALUES (?, 1) '
                    'ON CONFLICT("key") DO UPDATE SET takes = takes + 1',
                    (take.key,),
                )
            return Grant(True, wait)

    def release_limits(self, keys: list[str], holder: str) -> None:
        with self._conn.write() as db:
            db.executemany(
                'DELETE FROM limit_holders WHERE "key" = ? AND holder = ?',
                [(key, holder) for key in keys],
            )

    def pause_limit(self, key: str, seconds: float) -> None:
        with self._conn.write() as db:
            until = time.time() + seconds
            db.execute(
                'INSERT INTO limits ("key", req_tat, tok_tat, paused) VALUES (?, 0, 0, ?) '
                'ON CONFLICT("key") DO UPDATE SET paused = MAX(paused, excluded.paused)',
                (key, until),
            )

    def limit_paused(self, keys: list[str]) -> float:
        with self._conn.locked() as db:
            now = time.time()
            (until,) = db.execute(
                f'SELECT MAX(paused) FROM limits WHERE "key" IN ({marks(keys)})', keys
            ).fetchone()
        return max(0.0, (until or 0.0) - now)

    def limit_states(self) -> dict[str, LimitState]:
        now = time.time()
        with self._conn.locked() as db:
            # A key only threads entered (its concurrency key) has takes and no row in
            # limits: as in Redis, where entering counts in the key's hash, it is seen.
            rows = db.execute(
                'SELECT "key", req_tat, tok_tat, paused, (SELECT COUNT(*) FROM limit_holders h '
                'WHERE h."key" = limits."key" AND h.expires > ?) FROM limits UNION ALL '
                'SELECT "key", 0, 0, 0, 0 FROM limit_takes t WHERE NOT EXISTS '
                '(SELECT 1 FROM limits l WHERE l."key" = t."key")',
                (now,),
            ).fetchall()
        return {row[0]: LimitState(now, *row[1:]) for row in rows}

    def settle_limits(self, settles: list[Take]) -> None:
        settles = [s for s in settles if s.limit.tokens_per_minute and s.cost]
        if not settles:
            return
        with self._conn.write() as db:
            now = time.time()
            for settle in settles:
                assert settle.limit.tokens_per_minute is not None
                delta = 60 / settle.limit.tokens_per_minute * settle.cost
                # Same as Redis: a refund stops at a full budget, tok_tat never below now.
                db.execute(
                    'INSERT INTO limits ("key", req_tat, tok_tat, paused) '
                    "VALUES (?, 0, MAX(? + ?, ?), 0) "
                    'ON CONFLICT("key") DO UPDATE SET tok_tat = MAX(MAX(tok_tat, ?) + ?, ?)',
                    (settle.key, now, delta, now, now, delta, now),
                )

    def renew_limits(self, slots: list[Slot]) -> None:
        if not slots:
            return
        with self._conn.write() as db:
            now = time.time()
            db.executemany(
                'UPDATE limit_holders SET expires = ? WHERE "key" = ? AND holder = ? '
                "AND expires > ?",
                [(now + slot.ttl, slot.key, slot.holder, now) for slot in slots],
            )

    def limit_takes(self) -> dict[str, int]:
        with self._conn.locked() as db:
            rows = db.execute('SELECT "key", takes FROM limit_takes').fetchall()
        return {key: takes for key, takes in rows}
