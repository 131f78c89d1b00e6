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
    "incarnation",
    "reopened",
    "timeout",
    "timeout_at",
    "timed_out",
)
"""The fields of a thread's meta, as both backends store them. ``first`` is the oldest step
still stored; ``input``, ``result``, ``interrupt`` and ``resume`` hold msgpack bytes.
``options`` also holds the thread's ``canvas``, under :data:`CANVAS`, read apart from it.
``timeout`` and ``timeout_at`` are those of a wait for a human (seconds; a Unix time, only
while it waits); ``timed_out`` is the unanswered ``interrupt``, copied there when the
timeout took the thread out of its wait, until a step after it commits."""

CANVAS: Final = "canvas"
"""The key of the thread's canvas in its stored ``options``: kept there, as the options
are, from the first send, without a field of its own in either backend."""


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

    timed_out = fields.get("timed_out") not in (None, b"")
    options = blob("options") or {}
    canvas = options.pop(CANVAS, None)
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
        # A retry reopens a failed thread without its interrupt; its copy stays.
        interrupt=blob("timed_out" if timed_out else "interrupt"),
        resume_value=blob("resume"),
        resumed=fields.get("resume") not in (None, b""),
        cancel_requested=text("cancel") == "1",
        options=options,
        origin=text("origin"),
        incarnation=text("incarnation"),
        reopened=text("reopened") not in (None, "0"),
        canvas=canvas,
        timeout=None if text("timeout") is None else number("timeout"),
        timeout_at=None if text("timeout_at") is None else number("timeout_at"),
        timed_out=timed_out,
    )
