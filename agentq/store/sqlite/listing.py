"""``Store.listing`` on SQLite: the page and the counts in one statement, so they come
from one snapshot of the table. A row's cursor is its ``updated_at`` (``repr``: it reads
back as the same float) and its id, the order of the page."""

from __future__ import annotations

import time
from typing import Any, Final

from agentq.records import Listing, Status
from agentq.store.listing import cursor_parts, listed_thread
from agentq.store.sqlite.connection import SharedConnection

_COLUMNS: Final = (
    "thread_id, status, step, node, task, attempts, crashes, updated_at, error, cancel, "
    "CASE status WHEN 'waiting' THEN interrupt WHEN 'done' THEN result END, "
    "CASE WHEN status = 'running' AND lock_expires > ? THEN lock_owner END"
)
_UPDATED_AT: Final = 6
"""Where ``updated_at`` stands among a row's fields (the columns after the id)."""
# The page's rows come first (part 0, in the order of threads()), then one row per status
# present with its count in the step column (part 1).
_QUERY: Final = (
    f"SELECT * FROM (SELECT 0 AS part, {_COLUMNS} FROM threads {{where}} "
    "ORDER BY updated_at DESC, thread_id DESC LIMIT ?) "
    "UNION ALL SELECT 1, NULL, status, COUNT(*), NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
    "NULL, NULL FROM threads GROUP BY status ORDER BY part, updated_at DESC, thread_id DESC"
)
# A row value: SQLite seeks the index to it, where an OR of the two would scan.
_AFTER: Final = "(updated_at, thread_id) < (?, ?)"


class ListingMixin:
    """The listing of :class:`~agentq.store.sqlite.store.SQLiteStore`."""

    _conn: SharedConnection

    def listing(
        self, status: Status | None = None, *, limit: int = 50, after: str | None = None
    ) -> Listing:
        conditions: list[str] = []
        args: list[Any] = []
        if status:
            conditions.append("status = ?")
            args.append(Status(status).value)
        if after is not None:
            position, after_id = cursor_parts(after)
            conditions.append(_AFTER)
            args += [float(position), after_id]
        where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
        with self._conn.locked() as db:
            found = db.execute(_QUERY.format(where=where), (time.time(), *args, limit)).fetchall()
        counts = dict.fromkeys(Status, 0)
        rows = []
        for part, thread_id, *fields, owner in found:
            if part:
                counts[Status(fields[0])] = fields[1]
            else:
                cursor = f"{fields[_UPDATED_AT]!r}:{thread_id}"
                rows.append(listed_thread(thread_id, fields, owner, cursor))
        return Listing(counts, rows)
