"""``gc`` in chunks, so a long clean-up can show progress.

The store's own ``gc(finished_ttl)`` decides and deletes each thread atomically (a thread
reopened meanwhile is not deleted), but runs as one call. Calling it with TTLs that start
at the oldest finished thread and shrink to the requested one deletes the same threads in
age order, a chunk per call, with the same atomic checks: no thread newer than the
requested cutoff can be deleted, because no TTL used is shorter than the requested one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from agentq.records import FINISHED
from agentq.store.contract import Store

CHUNK: Final = 100
"""Threads per ``gc`` call when there are more than this many to delete."""
_PAGE: Final = 500


def finished_before(store: Store, cutoff: float) -> list[float]:
    """The update times of the finished threads last updated before ``cutoff``, oldest
    first. A count for progress only: the deleting call decides again."""
    times: list[float] = []
    for status in FINISHED:
        offset = 0
        while True:
            page = store.threads(status, limit=_PAGE, offset=offset)
            times.extend(meta.updated_at for meta in page if meta.updated_at < cutoff)
            if len(page) < _PAGE:
                break
            offset += _PAGE
    return sorted(times)


def collect(
    store: Store, older_than: float, on_progress: Callable[[int, int], None] | None = None
) -> int:
    """Delete the threads that finished more than ``older_than`` seconds ago; return how
    many. ``on_progress(removed, expected)`` is called after each chunk."""
    report = on_progress or (lambda removed, expected: None)
    times = finished_before(store, time.time() - older_than)
    removed = 0
    report(removed, len(times))
    if len(times) > CHUNK:
        for index in range(CHUNK - 1, len(times) - 1, CHUNK):
            # Strictly before this thread's update time: the chunk up to it, oldest first.
            removed += store.gc(max(older_than, time.time() - times[index]))
            report(removed, max(len(times), removed))
    removed += store.gc(older_than)
    report(removed, max(len(times), removed))
    return removed
