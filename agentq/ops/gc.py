"""``gc`` in chunks, so a long clean-up can show progress, and what it would delete.

The store's own ``gc(finished_ttl, statuses)`` decides and deletes each thread atomically
(a thread reopened meanwhile is not deleted), but runs as one call. Calling it with TTLs
that start at the oldest matching thread and shrink to the requested one deletes the same
threads in age order, a chunk per call, with the same atomic checks: no thread newer than
the requested cutoff can be deleted, because no TTL used is shorter than the requested one.
Every call but the last is limited to a chunk: only the last, unlimited one also reads
every index entry for a thread no longer there (Redis Cluster), which takes as long as
the store holds threads, so it is done once a run rather than once a chunk.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Final

from agentq.records import Status, ThreadMeta
from agentq.store.contract import Store

CHUNK: Final = 100
"""Threads per ``gc`` call when there are more than this many to delete."""
_PAGE: Final = 500

KEPT_UNLESS_ASKED: Final = frozenset({Status.FAILED, Status.NEEDS_ATTENTION})
"""Threads someone may still look into: ``agentq gc`` deletes them only when asked."""


def candidates(store: Store, cutoff: float, statuses: Collection[Status]) -> list[ThreadMeta]:
    """The threads in ``statuses`` last updated before ``cutoff``, oldest first: what a
    ``gc`` would delete now. A preview only: the deleting call decides again."""
    found: list[ThreadMeta] = []
    for status in sorted(statuses):
        offset = 0
        while True:
            page = store.threads(status, limit=_PAGE, offset=offset)
            found.extend(meta for meta in page if meta.updated_at < cutoff)
            if len(page) < _PAGE:
                break
            offset += _PAGE
    return sorted(found, key=lambda meta: meta.updated_at)


def collect(
    store: Store,
    older_than: float,
    statuses: Collection[Status],
    on_progress: Callable[[int, int], None] | None = None,
) -> int:
    """Delete the threads in ``statuses`` last updated more than ``older_than`` seconds
    ago; return how many. ``on_progress(removed, expected)`` is called after each chunk."""
    report = on_progress or (lambda removed, expected: None)
    times = [meta.updated_at for meta in candidates(store, time.time() - older_than, statuses)]
    removed = 0
    report(removed, len(times))
    if len(times) > CHUNK:
        for index in range(CHUNK - 1, len(times) - 1, CHUNK):
            # Strictly before this thread's update time: the chunk up to it, oldest first.
            ttl = max(older_than, time.time() - times[index])
            removed += store.gc(ttl, statuses, limit=CHUNK)
            report(removed, max(len(times), removed))
    removed += store.gc(older_than, statuses)
    report(removed, max(len(times), removed))
    return removed
