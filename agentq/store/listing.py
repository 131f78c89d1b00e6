"""A page of threads for a list of them (``Store.listing``), read back alike from a Redis
reply and a SQLite row: texts as bytes or str, absent fields as ``None``, ``False`` or
empty."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentq.codec.envelope import decode_value
from agentq.records import ListedThread, Schedule, Status, ThreadMeta

_NOTES = {Status.WAITING: "interrupt", Status.DONE: "result"}
"""The statuses whose row shows a stored value, and the meta field holding it."""


def _absent(value: Any) -> bool:
    return value is None or value is False or value in (b"", "")


def _text(value: Any) -> str | None:
    if not value:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def listed_thread(thread_id: str, fields: Sequence[Any], owner: Any) -> ListedThread:
    """The row from the stored ``status, step, node, task, attempts, crashes, updated_at,
    error, cancel`` and ``note``: the encoded value :data:`_NOTES` names for the status
    (ignored for the others); ``owner`` is the live lease's."""
    status, step, node, task, attempts, crashes, updated_at, error, cancel, note = fields
    state = Status(_text(status) or "queued")
    field = _NOTES.get(state)
    shown = (
        decode_value(bytes(note), what=f"meta.{field}", thread_id=thread_id, step=None)
        if field and note
        else None
    )
    return ListedThread(
        thread_id,
        state,
        int(-1 if _absent(step) else step),
        _text(node),
        _text(task) or "",
        int(attempts or 0),
        int(crashes or 0),
        float(updated_at or 0),
        _text(error),
        cancel in (b"1", "1", 1),
        interrupt=shown if state is Status.WAITING else None,
        result=shown if state is Status.DONE else None,
        owner=_text(owner),
    )


def listed_from_meta(meta: ThreadMeta, schedule: Schedule) -> ListedThread:
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
    )
