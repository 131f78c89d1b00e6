"""A page of threads for a list of them (``Store.listing``), read back alike from a Redis
reply and a SQLite row: texts as bytes or str, absent fields as ``None``, ``False`` or
empty. A page reads 50 rows per request, so each is converted with as few calls as
Python allows."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final

from agentq.codec.envelope import decode_value
from agentq.errors import InvalidArgument
from agentq.records import ListedThread, Schedule, Status, ThreadMeta

_STATUSES: Final[dict[str | bytes, Status]] = {
    **{status.value: status for status in Status},
    **{status.value.encode(): status for status in Status},
}


_POSITION: Final = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?")
"""A cursor's position as both stores write it: a score as Redis formats it, a float's
``repr``; what Python's ``float()`` alone accepts (``1_0``, ``nan``, spaces) Redis does not."""


_CANCEL_SET: Final = frozenset((b"1", "1", 1))
"""How a requested cancellation is stored: Redis gives bytes, SQLite a number."""


def _text(value: Any) -> str | None:
    if not value:
        return None
    return value.decode() if value.__class__ is bytes else str(value)


_make = ListedThread._make


def listed_thread(thread_id: str, fields: Sequence[Any], owner: Any, cursor: str) -> ListedThread:
    """The row from the stored ``status, step, node, task, attempts, crashes, updated_at,
    error, cancel`` and ``note``: the encoded ``interrupt`` of a ``waiting`` thread or
    ``result`` of a ``done`` one (ignored for the others); ``owner`` is the live lease's."""
    status, step, node, task, attempts, crashes, updated_at, error, cancel, note = fields
    state = _STATUSES.get(status, Status.QUEUED)
    interrupt = result = None
    if note:
        if state is Status.WAITING:
            interrupt = decode_value(
                bytes(note), what="meta.interrupt", thread_id=thread_id, step=None
            )
        elif state is Status.DONE:
            result = decode_value(bytes(note), what="meta.result", thread_id=thread_id, step=None)
    return _make(
        (
            thread_id,
            state,
            int(step) if step.__class__ is int or step else -1,  # SQLite: 0; Redis: b"0"
            _text(node),
            _text(task) or "",
            int(attempts) if attempts else 0,
            int(crashes) if crashes else 0,
            float(updated_at) if updated_at else 0.0,
            _text(error),
            cancel in _CANCEL_SET,
            interrupt,
            result,
            _text(owner),
            cursor,
        )
    )


def listed_from_meta(meta: ThreadMeta, schedule: Schedule, cursor: str) -> ListedThread:
    """The row of a meta read whole (where the page cannot be read in one call)."""
    return ListedThread(
        meta.thread_id,
        meta.status,
        meta.step,
        meta.node,
        meta.task,
        meta.attempts,
        meta.crashes,
        meta.updated_at,
        meta.error,
        meta.cancel_requested,
        interrupt=meta.interrupt if meta.status is Status.WAITING else None,
        result=meta.result if meta.status is Status.DONE else None,
        owner=schedule.owner if meta.status is Status.RUNNING else None,
        cursor=cursor,
    )


def cursor_parts(after: str) -> tuple[str, str]:
    """The position and thread id of a row's ``cursor`` (``<position>:<thread id>``)."""
    position, colon, thread_id = after.partition(":")
    if not (_POSITION.fullmatch(position) and colon and thread_id):
        raise InvalidArgument(
            f"{after!r} is not a cursor of a listing: pass the cursor of a row an earlier "
            "listing() returned, or none for the first page"
        )
    return position, thread_id
