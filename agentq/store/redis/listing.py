"""``Store.listing`` on Redis: the counts, a page of an index and each row's fields in one
script (``lua/listing.lua``), whose reply is one msgpack string rather than hundreds of
RESP values, so the client parses one reply whatever the page holds."""

from __future__ import annotations

from typing import Final

import msgpack

from agentq.records import Listing, Schedule, Status
from agentq.store.listing import listed_from_meta, listed_thread
from agentq.store.redis.base import RedisBase

_MARK: Final = "\n"
"""Stands for a thread id while a key is split around it: ids never hold one, and the
key's part after the id never does either (a prefix might)."""


class RedisListing(RedisBase):
    def listing(self, status: Status | None = None, *, limit: int = 50, offset: int = 0) -> Listing:
        if self.cluster:  # the indexes and each thread live in different slots
            return self._listing_by_parts(status, limit, offset)
        before, _, after_meta = self.keys.meta(_MARK).rpartition(_MARK)
        after_lock = self.keys.lock(_MARK).rpartition(_MARK)[2]
        packed = self._scripts["listing"](
            keys=[],
            args=[
                self.keys.status_index_prefix(),
                before,
                after_meta,
                after_lock,
                offset,
                limit,
                status.value if status else "",
                *(each.value for each in Status),
            ],
        )
        counts, rows = msgpack.unpackb(packed, raw=True)
        listed = []
        for thread_id, *fields, lock in rows:
            owner = lock.partition(b":")[2] if lock else None  # <token>:<owner>
            listed.append(listed_thread(thread_id.decode(), fields, owner))
        return Listing(dict(zip(Status, counts, strict=True)), listed)

    def _listing_by_parts(self, status: Status | None, limit: int, offset: int) -> Listing:
        metas = self.threads(status, limit=limit, offset=offset)
        running = [meta.thread_id for meta in metas if meta.status is Status.RUNNING]
        schedules = {s.thread_id: s for s in self.schedules(running)} if running else {}
        rows = [
            listed_from_meta(meta, schedules.get(meta.thread_id, Schedule(meta.thread_id)))
            for meta in metas
        ]
        return Listing(self.status_counts(), rows)
