"""How values read on the pages: times, durations, sizes, one-line previews (the
templates' filters). Each returns plain text; the templates escape it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from agentq.ops.jsonable import short


def ago(timestamp: float | None, now: float | None = None) -> str:
    """How long before ``now`` (default: this moment) a Unix time was, in the largest
    whole unit: ``42s ago``, ``3h ago``."""
    if not timestamp:
        return "-"
    return span(max(0.0, (time.time() if now is None else now) - timestamp)) + " ago"


def until(timestamp: float | None) -> str:
    """How far away a Unix time is: ``in 12s``, or ``12s ago`` once passed."""
    if timestamp is None:
        return "-"
    left = timestamp - time.time()
    return f"in {span(left)}" if left >= 0 else f"{span(-left)} ago"


def span(seconds: float) -> str:
    """A duration in its largest whole unit: ``2h``, ``5m``, ``0s``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def took(seconds: float | None) -> str:
    """A node's run time, to the millisecond under a minute."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    return span(seconds)


def when(timestamp: float | None) -> str:
    """A Unix time as local date and time, to the second."""
    if not timestamp:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def size(count: int | None) -> str:
    if count is None:
        return "-"
    for unit, factor in (("MB", 1 << 20), ("KB", 1 << 10)):
        if count >= factor:
            return f"{count / factor:.1f} {unit}"
    return f"{count} B"


def error_line(text: str | None, limit: int = 80) -> str:
    """The line of an error that says what went wrong: a traceback's last one."""
    if not text:
        return ""
    lines = text.strip().splitlines()
    return short(lines[-1] if lines[0].startswith("Traceback") else lines[0], limit)


FILTERS: Final[dict[str, Callable[..., Any]]] = {
    "ago": ago,
    "until": until,
    "took": took,
    "span": span,
    "when": when,
    "size": size,
    "short": short,
    "error_line": error_line,
}
