"""How the command line prints: rich tables for people, ``--json`` for scripts."""

from __future__ import annotations

import time
from typing import Any, Final

import click
from rich.console import Console, RenderableType
from rich.text import Text

from agentq.ops.jsonable import dumps
from agentq.records import Status, ThreadMeta
from agentq.records import step_at as _step_at

STATUS_STYLES: Final = {
    Status.QUEUED: "blue",
    Status.RUNNING: "cyan",
    Status.WAITING: "yellow",
    Status.RETRYING: "yellow",
    Status.DONE: "green",
    Status.FAILED: "bold red",
    Status.NEEDS_ATTENTION: "bold magenta",
    Status.CANCELLED: "dim",
}


def show_block(out: Console, renderable: RenderableType) -> None:
    """Print a table or panel; piped, without the padding rich adds after the last column,
    so each line ends where its text does."""
    if out.is_terminal:
        out.print(renderable)
        return
    with out.capture() as captured:
        out.print(renderable)
    for line in captured.get().splitlines():
        out.file.write(line.rstrip() + "\n")


def emit_json(data: Any) -> None:
    click.echo(dumps(data, indent=2))


def status_text(status: Status) -> Text:
    return Text(status.value, style=STATUS_STYLES.get(status, ""))


def ago(timestamp: float, now: float | None = None) -> str:
    """How long ago a Unix time was, in the largest whole unit: ``42s ago``, ``3h ago``."""
    if not timestamp:
        return "-"
    seconds = max(0.0, (time.time() if now is None else now) - timestamp)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def when(timestamp: float) -> str:
    """A Unix time as local date and time, to the second."""
    if not timestamp:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def duration(seconds: float) -> str:
    """Seconds as the largest unit that keeps it exact enough to read: ``7d``, ``90s``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def step_at(meta: ThreadMeta) -> int:
    """The step a thread is at (see :func:`agentq.records.step_at`)."""
    return _step_at(meta.status, meta.step)
