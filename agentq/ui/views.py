"""What the pages show, read from the store's public API: a page of threads, one thread.

Listing walks the status indexes newest first (``Store.listing``), never the keyspace,
a page going on from the cursor of the last row of the one before. Filters by task or id
prefix are applied to the index pages as they are read, at most :data:`SCAN_LIMIT`
entries per request; the page then says how far it looked and links on from there.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Final

from agentq.codec.envelope import encode_value
from agentq.ids import downstream_key
from agentq.ops.diffing import Change, changed_parts, checkpoint_changes
from agentq.ops.jsonable import plain
from agentq.records import Checkpoint, Effect, ListedThread, Schedule, Status, ThreadMeta
from agentq.store.contract import Store

PAGE: Final = 50
SCAN_CHUNK: Final = 200
SCAN_LIMIT: Final = 2000
TIMELINE_LIMIT: Final = 200
SHOWN_BYTES: Final = 64 * 1024
"""JSON longer than this is cut on the page, with a link to the whole document."""
_DIGEST: Final = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Filter:
    status: Status | None = None
    task: str = ""
    prefix: str = ""

    @property
    def narrows(self) -> bool:
        """Whether rows are picked from the index pages rather than taken as they come."""
        return bool(self.task or self.prefix)

    def admits(self, row: ListedThread) -> bool:
        return (not self.task or row.task == self.task) and row.thread_id.startswith(self.prefix)


@dataclass(frozen=True)
class ThreadsPage:
    counts: dict[Status, int]
    rows: list[ListedThread]
    after: str | None
    """The cursor this page starts after (``None``: the first page)."""
    next_after: str | None
    """The cursor the next page starts after (``None``: this is the last)."""
    examined: int
    """Index entries read to fill the page (more than the rows when a filter narrows)."""


def threads_page(store: Store, wanted: Filter, after: str | None, limit: int = PAGE) -> ThreadsPage:
    """The counts and the page of threads after the cursor ``after``, newest first: one
    store call (``Store.listing``) unless a filter narrows."""
    if not wanted.narrows:
        listing = store.listing(wanted.status, limit=limit + 1, after=after)
        rows = listing.rows[:limit]
        more = len(listing.rows) > limit
        return ThreadsPage(
            listing.counts, rows, after, rows[-1].cursor if more else None, len(rows)
        )
    found: list[ListedThread] = []
    position, examined = after, 0
    counts: dict[Status, int] | None = None
    while True:
        chunk = store.listing(wanted.status, limit=SCAN_CHUNK, after=position)
        counts = counts or chunk.counts
        for row in chunk.rows:
            examined += 1
            position = row.cursor
            if wanted.admits(row):
                found.append(row)
                if len(found) == limit:
                    return ThreadsPage(counts, found, after, position, examined)
        if len(chunk.rows) < SCAN_CHUNK:
            return ThreadsPage(counts, found, after, None, examined)
        if examined >= SCAN_LIMIT:
            return ThreadsPage(counts, found, after, position, examined)


@dataclass(frozen=True)
class Step:
    """One checkpoint on the timeline."""

    checkpoint: Checkpoint
    took: float | None
    """Seconds since the checkpoint before it: the node's run, waits included."""
    size: int
    """Bytes of its state, pending calls and cursors, encoded as stored."""
    changed: list[str]


@dataclass(frozen=True)
class Artifact:
    digest: str
    size: int | None
    content_type: str
    path: str


@dataclass
class ThreadView:
    meta: ThreadMeta
    schedule: Schedule
    timeline: list[Step]
    shown: Checkpoint | None
    effects: list[Effect]
    sent_as: dict[str, str]
    """Each effect's idempotency key as its tool sent it downstream, by effect key: what
    an operator looks the call up by at the service before settling it."""
    artifacts: list[Artifact] = field(default_factory=list)


@dataclass(frozen=True)
class Summary:
    """What a thread page's live part shows: the meta and the lease."""

    meta: ThreadMeta
    schedule: Schedule


def summary(store: Store, meta: ThreadMeta) -> Summary:
    (schedule,) = store.schedules([meta.thread_id])
    return Summary(meta, schedule)


def thread_view(store: Store, meta: ThreadMeta, step: int | None) -> ThreadView:
    """A thread with its checkpoints (newest first), the one at ``step`` (default the
    latest) and its effect records."""
    thread_id = meta.thread_id
    checkpoints = _checkpoints(store, thread_id)
    timeline = []
    for index, checkpoint in enumerate(checkpoints):
        older = checkpoints[index + 1] if index + 1 < len(checkpoints) else None
        follows = older is not None and older.step == checkpoint.step - 1
        timeline.append(
            Step(
                checkpoint,
                checkpoint.created_at - older.created_at if follows and older else None,
                _size(thread_id, checkpoint),
                changed_parts(older, checkpoint) if follows and older else [],
            )
        )
    shown: Checkpoint | None
    if step is None:
        shown = checkpoints[0] if checkpoints else None
    else:
        shown = next((c for c in checkpoints if c.step == step), None) or store.checkpoint(
            thread_id, step
        )
    (schedule,) = store.schedules([thread_id])
    effects = store.effects(thread_id)
    sent_as = {
        e.key: downstream_key(
            store.key_namespace, thread_id, e.key, shared=False, incarnation=meta.incarnation
        )
        for e in effects
    }
    view = ThreadView(meta, schedule, timeline, shown, effects, sent_as)
    if shown is not None:
        view.artifacts = list(artifacts_in(shown.state, "state"))
    return view


def _checkpoints(store: Store, thread_id: str) -> list[Checkpoint]:
    found: list[Checkpoint] = []
    before = None
    while len(found) < TIMELINE_LIMIT:
        page = store.history(thread_id, before=before, limit=100)
        found.extend(page)
        if len(page) < 100:
            break
        before = page[-1].step
    return found[:TIMELINE_LIMIT]


def _size(thread_id: str, checkpoint: Checkpoint) -> int:
    parts = [checkpoint.state, checkpoint.pending, checkpoint.cursors]
    return len(encode_value(parts, what="checkpoint", thread_id=thread_id, step=checkpoint.step))


def artifacts_in(value: Any, path: str) -> Any:
    """The artifact references (``run.artifacts.put``'s) anywhere in ``value``."""
    if isinstance(value, dict):
        digest = value.get("artifact")
        if isinstance(digest, str) and _DIGEST.match(digest):
            size = value.get("size")
            kind = value.get("content_type")
            yield Artifact(
                digest,
                size if isinstance(size, int) else None,
                kind if isinstance(kind, str) else "",
                path,
            )
            return
        for key, item in value.items():
            yield from artifacts_in(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from artifacts_in(item, f"{path}[{index}]")


def diff(store: Store, thread_id: str, a: int, b: int) -> list[Change]:
    """The changes from step ``a`` to step ``b``, as ``agentq diff`` prints them."""
    return checkpoint_changes(store.checkpoint(thread_id, a), store.checkpoint(thread_id, b))


@dataclass(frozen=True)
class Shown:
    """A JSON document as the page shows it: cut after :data:`SHOWN_BYTES` characters."""

    text: str
    cut: bool
    total: int


def as_json(value: Any, limit: int = SHOWN_BYTES) -> Shown:
    text = json.dumps(plain(value), indent=2, ensure_ascii=False)
    if len(text) <= limit:
        return Shown(text, False, len(text))
    return Shown(text[:limit], True, len(text))
