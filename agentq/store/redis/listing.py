"""``Store.listing`` on Redis: the counts, a page of an index and each row's fields in one
script (``lua/listing.lua``), whose reply is one msgpack string rather than hundreds of
RESP values, so the client parses one reply whatever the page holds. A row's cursor is its
score in the status index and its id: the script goes on from there."""

from __future__ import annotations

from typing import Any, Final

import msgpack

from agentq.records import Listing, Schedule, Status
from agentq.store.listing import cursor_parts, listed_from_meta, listed_thread
from agentq.store.meta_fields import meta_from_fields
from agentq.store.redis.base import RedisBase
from agentq.store.redis.decode import fields

_MARK: Final = "\n"
"""Stands for a thread id while a key is split around it: ids never hold one, and the
key's part after the id never does either (a prefix might)."""


class RedisListing(RedisBase):
    def listing(
        self, status: Status | None = None, *, limit: int = 50, after: str | None = None
    ) -> Listing:
        position, after_id = ("", "") if after is None else cursor_parts(after)
        # On Cluster the metas live in other slots than the indexes: ids first, then them.
        before, _, after_meta = (
            ("", "", "") if self.cluster else self.keys.meta(_MARK).rpartition(_MARK)
        )
        after_lock = self.keys.lock(_MARK).rpartition(_MARK)[2]
        packed = self._scripts["listing"](
            keys=[self.keys.status_index(Status.QUEUED.value)],
            args=[
                self.keys.status_index_prefix(),
                before,
                after_meta,
                after_lock,
                position,
                after_id,
                limit,
                status.value if status else "",
                *(each.value for each in Status),
            ],
        )
        counts, rows = msgpack.unpackb(packed, raw=True)
        counted = dict(zip(Status, counts, strict=True))
        if self.cluster:
            return Listing(counted, self._rows_by_parts(rows))
        listed = []
        for thread_id, score, *stored, lock in rows:
            owner = lock.partition(b":")[2] if lock else None  # <token>:<owner>
            name = thread_id.decode()
            listed.append(listed_thread(name, stored, owner, f"{score.decode()}:{name}"))
        return Listing(counted, listed)

    def _rows_by_parts(self, entries: list[Any]) -> list[Any]:
        ids = [(entry[0].decode(), entry[1].decode()) for entry in entries]
        pipe = self.client.pipeline(transaction=False)
        for thread_id, _ in ids:
            pipe.hgetall(self.keys.meta(thread_id))
        metas = [
            meta_from_fields(thread_id, fields(record))
            for (thread_id, _), record in zip(ids, pipe.execute(), strict=True)
            if record
        ]
        running = [meta.thread_id for meta in metas if meta.status is Status.RUNNING]
        schedules = {s.thread_id: s for s in self.schedules(running)} if running else {}
        cursors = {thread_id: f"{score}:{thread_id}" for thread_id, score in ids}
        return [
            listed_from_meta(
                meta,
                schedules.get(meta.thread_id, Schedule(meta.thread_id)),
                cursors[meta.thread_id],
            )
            for meta in metas
        ]
