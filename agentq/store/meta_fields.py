"""A thread's meta as both backends store it: the field names and how to read them back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from agentq.codec.envelope import decode_value
from agentq.records import Status, ThreadMeta

META_FIELDS: Final = (
    "status",
    "step",
    "node",
    "task",
    "attempts",
    "crashes",
    "fence",
    "first",
    "error",
    "created_at",
    "updated_at",
    "input",
    "result",
    "interrupt",
    "resume",
    "cancel",
    "options",
    "origin",
)
"""The fields of a thread's meta, as both backends store them. ``first`` is the oldest step
still stored; ``input``, ``result``, ``interrupt`` and ``resume`` hold msgpack bytes."""


def meta_from_fields(thread_id: str, fields: Mapping[str, Any]) -> ThreadMeta:
    """Build a :class:`ThreadMeta` from stored fields (Redis hash bytes or SQLite values)."""

    def text(name: str) -> str | None:
        value = fields.get(name)
        if value is None or value == b"" or value == "":
            return None
        return value.decode() if isinstance(value, bytes) else str(value)

    def number(name: str, default: float = 0) -> float:
        value = text(name)
        return float(value) if value is not None else default

    def blob(name: str) -> Any:
        value = fields.get(name)
        if value is None or value == b"":
            return None
        return decode_value(bytes(value), what=f"meta.{name}", thread_id=thread_id, step=None)

    return ThreadMeta(
        thread_id=thread_id,
        status=Status(text("status") or "queued"),
        step=int(number("step", -1)),
        node=text("node"),
        task=text("task") or "",
        attempts=int(number("attempts")),
        crashes=int(number("crashes")),
        fence=int(number("fence")),
        error=text("error"),
        created_at=number("created_at"),
        updated_at=number("updated_at"),
        input=blob("input"),
        result=blob("result"),
        interrupt=blob("interrupt"),
        resume_value=blob("resume"),
        resumed=fields.get("resume") not in (None, b""),
        cancel_requested=text("cancel") == "1",
        options=blob("options") or {},
        origin=text("origin"),
    )
