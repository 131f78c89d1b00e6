"""The store on Redis and Redis-API servers with Lua (Valkey, KeyDB, Dragonfly, ...).

:class:`RedisStore` is the threads' life (open, lease, fork, reopen, cancel, delete),
recovery and operations; commits and reads come from
:class:`~agentq.store.redis.checkpoints.RedisCheckpoints`, effect records from
:class:`~agentq.store.redis.effects.RedisEffects`, and the client, keys, scripts and
indexes they all use from :class:`~agentq.store.redis.base.RedisBase`.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final

from redis.cluster import RedisCluster

from agentq.codec.envelope import decode_checkpoint, decode_envelope, encode_value
from agentq.errors import (
    ArtifactNotFound,
    GraphStepMoved,
    LeaseLost,
    ThreadExists,
    ThreadNotFound,
)
from agentq.ids import new_incarnation
from agentq.records import Finding, Schedule, Status, ThreadMeta
from agentq.store.contract import UNSET, Renewal, Taken, final_checkpoint, refuse_graph_fork
from agentq.store.contract.leases import RESEND_SPACING_CAP
from agentq.store.contract.threads import not_reopenable
from agentq.store.meta_fields import meta_from_fields
from agentq.store.redis.base import request_id
from agentq.store.redis.checkpoints import RedisCheckpoints
from agentq.store.redis.decode import blob, fields, hash_to_fields, log_fields, raise_refusal, text
from agentq.store.redis.effects import RedisEffects
from agentq.store.redis.findings import server_findings
from agentq.store.redis.graph import GraphCopy, RedisGraph, index_entries, unindex
from agentq.store.redis.graph_keys import GraphKeys
from agentq.store.redis.limits import RedisLimits
from agentq.store.redis.listing import RedisListing
from agentq.store.redis.refusal import Refusal
from agentq.store.redis.thread_keys import RedisThreadKeys
from agentq.store.redis.transient import is_transient

logger = logging.getLogger(__name__)


_DRIVEN: Final = ("status", "step", "fence")
"""The meta fields that tell whether a worker has taken a thread since they were read."""
_SYNCED_PAGE: Final = 500
"""Threads of the Cluster's synced hash read at a time for entries left behind: all of
them by a ``gc`` without a limit, one page by a limited one."""


def _fork_taken(thread_id: str, step: int, new_thread_id: str) -> ThreadExists:
    return ThreadExists(
        f"cannot fork step {step} of {thread_id!r} into an existing thread; pick "
        "another id or delete that thread first",
        thread_id=new_thread_id,
    )


def _refuse_driven(thread_id: str, step: int, driven: list[Any]) -> None:
    status, latest, _ = driven
    if status is None:
        raise ThreadNotFound("cannot fork: the thread was deleted meanwhile", thread_id=thread_id)
    refuse_graph_fork(thread_id, step, Status(text(status)), int(latest))


def _millis(ttl: float) -> int:
    """A lease TTL as the whole milliseconds ``PX`` takes (the contract refused < 1 ms)."""
    return int(ttl * 1000)


class RedisStore(RedisCheckpoints, RedisEffects, RedisLimits, RedisListing, RedisThreadKeys):
    """Threads in Redis. Construct from a client or with :meth:`from_url`.

    ``client`` must return bytes (``decode_responses=False``, the default). A
    :class:`redis.cluster.RedisCluster` client is used in cluster mode.
    """

    def _do_open_thread(
        self,
        thread_id: str,
        *,
        task: str,
        node: str | None,
        input: Any,
        start_grace: float,
        options: Mapping[str, Any] | None,
        origin: str | None,
    ) -> tuple[ThreadMeta, bool]:
        blobs = [
            b"" if value is None else encode_value(value, what=name, thread_id=thread_id, step=None)
            for name, value in (("input", input), ("options", options or None))
        ]
        created, flat, _ = self._run(
            "open_thread",
            [self.keys.meta(thread_id)],
            [
                thread_id,
                task,
                blobs[0],
                start_grace,
                blobs[1],
                origin or "",
                new_incarnation(),
                node or "",
            ],
            indexed=True,
        )
        return self._meta(thread_id, hash_to_fields(flat)), bool(created)

    def _do_meta(self, thread_id: str) -> ThreadMeta | None:
        record = self.client.hgetall(self.keys.meta(thread_id))
        if not record:
            return None
        return self._meta(thread_id, fields(record))

    def threads(
        self, status: Status | None = None, *, limit: int = 100, offset: int = 0
    ) -> list[ThreadMeta]:
        statuses = [status] if status is not None else list(Status)
        pipe = self.client.pipeline(transaction=False)
        for each in statuses:
            pipe.zrevrange(
                self.keys.status_index(each.value), 0, offset + limit - 1, withscores=True
            )
        ranked = heapq.merge(*pipe.execute(), key=lambda item: -item[1])
        ids = [member.decode() for member, _ in ranked][offset : offset + limit]
        pipe = self.client.pipeline(transaction=False)
        for thread_id in ids:
            pipe.hgetall(self.keys.meta(thread_id))
        metas = []
        for thread_id, record in zip(ids, pipe.execute(), strict=True):
            if record:
                metas.append(meta_from_fields(thread_id, fields(record)))
        return metas

    def status_counts(self) -> dict[Status, int]:
        pipe = self.client.pipeline(transaction=False)
        for each in Status:
            pipe.zcard(self.keys.status_index(each.value))
        return dict(zip(Status, map(int, pipe.execute()), strict=True))

    def _do_schedules(self, thread_ids: Sequence[str]) -> list[Schedule]:
        pipe = self.client.pipeline(transaction=False)
        for thread_id in thread_ids:
            pipe.get(self.keys.lock(thread_id))
            pipe.pttl(self.keys.lock(thread_id))
            pipe.zscore(self.keys.due(), thread_id)
        replies = pipe.execute()
        found = []
        for index, thread_id in enumerate(thread_ids):
            lock, ttl_ms, due_at = replies[3 * index : 3 * index + 3]
            if lock is None:
                found.append(Schedule(thread_id, due_at=due_at))
                continue
            token, _, owner = lock.decode().partition(":")
            found.append(
                Schedule(
                    thread_id,
                    owner=owner,
                    token=int(token),
                    lease_left=max(ttl_ms, 0) / 1000,
                    due_at=due_at,
                )
            )
        return found

    def _do_delete_thread(self, thread_id: str) -> bool:
        return self._delete(thread_id, updated_before="", statuses=())

    def _delete(
        self, thread_id: str, *, updated_before: float | str, statuses: Collection[Status]
    ) -> bool:
        keys = self.keys
        self._heads.pop(thread_id, None)
        deleted, graph_runs, _ = self._run(
            "delete_thread",
            [
                keys.meta(thread_id),
                keys.latest(thread_id),
                keys.lock(thread_id),
                keys.owned(thread_id),
            ],
            [
                thread_id,
                keys.checkpoint_prefix(thread_id),
                updated_before,
                keys.thread(thread_id),
                *(s.value for s in statuses),
            ],
            indexed=True,
        )
        if graph_runs is not None:
            # As graph().delete_thread does; left behind, the entries would pile up with
            # every finished graph thread gc deletes.
            runs = [text(run) for run in graph_runs]
            unindex(self.client, index_entries(GraphKeys(self.keys), thread_id, runs))
        return bool(deleted)

    def _do_fork(self, thread_id: str, step: int, new_thread_id: str) -> ThreadMeta:
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.keys.checkpoint(thread_id, step))
        pipe.hmget(self.keys.meta(thread_id), ["created_at", "task", "input", "options", *_DRIVEN])
        pipe.smembers(self.keys.owned(thread_id))
        pipe.exists(self.keys.meta(new_thread_id))
        data, (created, task, input_blob, options_blob, *driven), owned_keys, taken = pipe.execute()
        if data is None:
            raise self._not_stored(thread_id, step, forking=True)
        if taken:
            # Before the LangGraph indexes name the fork: refused later (a thread made
            # under that id meanwhile), their entries stay, as that thread may count on them.
            raise _fork_taken(thread_id, step, new_thread_id)
        source = decode_checkpoint(thread_id, blob(data), step=step)
        if source.node is None:
            raise final_checkpoint(thread_id, step)
        owned = sorted(text(key) for key in owned_keys)
        graph, indexed = self._graph_copy(thread_id, step, new_thread_id, owned, driven)
        try:
            _, lengths = decode_envelope(thread_id, blob(data), step=step)
            log_args: list[Any] = [len(lengths)]
            for field, length in lengths.items():
                items = self.client.lrange(self.keys.log(thread_id, field), 0, length - 1)
                log_args += [field, len(items), *items]
            artifact_args = self._artifact_args(thread_id, owned)
            # Read in several round trips, as no script may read the source and write the fork
            # on Cluster: a source deleted meanwhile (gc) would leave the fork a checkpoint
            # whose logs or artifacts were never copied.
            if (
                created is None
                or self.client.hget(self.keys.meta(thread_id), "created_at") != created
            ):
                raise ThreadNotFound(
                    "cannot fork: the thread was deleted while its checkpoint was being read; "
                    "nothing was written",
                    thread_id=thread_id,
                    step=step,
                )
            made, flat, _ = self._run(
                "create_fork",
                [
                    self.keys.meta(new_thread_id),
                    self.keys.latest(new_thread_id),
                    self.keys.checkpoint(new_thread_id, step),
                    self.keys.owned(new_thread_id),
                ],
                [
                    new_thread_id,
                    data,
                    step,
                    source.node or "",
                    text(task or source.task),
                    input_blob or "",
                    self.keys.thread(new_thread_id),
                    log_fields(lengths),
                    options_blob or "",
                    request_id(),
                    new_incarnation(),
                    *log_args,
                    *artifact_args,
                    graph.packed() if graph.commands else "",
                ],
                indexed=True,
            )
        except ThreadNotFound:
            # Nothing was written and no thread has the fork's id: the entries made ahead
            # of the copy would name a thread that holds none of it, for good.
            unindex(self.client, indexed)
            raise
        if not made:
            raise _fork_taken(thread_id, step, new_thread_id)
        return self._meta(new_thread_id, hash_to_fields(flat))

    def _graph_copy(
        self, thread_id: str, step: int, new_thread_id: str, owned: list[str], driven: list[Any]
    ) -> tuple[GraphCopy, list[tuple[str, str]]]:
        """The source's LangGraph keys for the fork, refused unless they stand where
        ``step`` does (:func:`refuse_graph_fork`), and the index entries made for the fork
        ahead of them. ``driven`` is the source's status, step and fence as read before;
        they are read again after the keys, since no script can read the source and write
        the fork on Cluster: a fence that moved means a worker took the thread meanwhile
        and may have written some of them."""
        graph = self.graph()
        if not graph.holds(thread_id, owned):
            return GraphCopy([], []), []
        _refuse_driven(thread_id, step, driven)
        copied = graph.read_copy(thread_id, new_thread_id)
        after = self.client.hmget(self.keys.meta(thread_id), list(_DRIVEN))
        _refuse_driven(thread_id, step, after)
        if after != driven:
            raise GraphStepMoved(
                "cannot fork this LangGraph thread: a worker took it while its LangGraph "
                "checkpoints were being read; fork it again once it waits or has stopped",
                thread_id=thread_id,
                step=step,
            )
        return copied, graph.index_copy(new_thread_id, copied).created

    def _artifact_args(self, thread_id: str, owned: list[str]) -> list[Any]:
        """Every artifact of the thread as create_fork takes them: how many, then each as
        (digest, bytes). All of them, not only those the forked checkpoint names: a
        reference may sit anywhere in the state, its logs or the cursors, and the same
        digest is the same bytes, so a spare copy is only space, a missing one a failure."""
        prefix = self.keys.artifact(thread_id, "")
        keys = [key for key in owned if key.startswith(prefix)]
        # A source deleted since SMEMBERS has no bytes left: the fork is then refused.
        found = [
            (key.removeprefix(prefix), data)
            for key, data in zip(keys, self.client.mget(keys) if keys else [], strict=True)
            if data is not None
        ]
        return [len(found), *(part for pair in found for part in pair)]

    def _do_reopen(
        self,
        thread_id: str,
        *,
        from_statuses: Collection[Status],
        resume_value: Any,
        start_grace: float,
    ) -> ThreadMeta:
        blob = (
            b""
            if resume_value is UNSET
            else encode_value(resume_value, what="resume value", thread_id=thread_id, step=None)
        )
        code, flat, _ = self._run(
            "reopen",
            [self.keys.meta(thread_id)],
            [thread_id, start_grace, blob, request_id(), *(s.value for s in from_statuses)],
            indexed=True,
        )
        if code == Refusal.STATUS_REFUSED:
            raise not_reopenable(thread_id, text(flat), from_statuses)
        raise_refusal(code, flat, thread_id=thread_id)
        return meta_from_fields(thread_id, hash_to_fields(flat))

    def _do_request_cancel(self, thread_id: str) -> Status:
        code, status, _ = self._run(
            "request_cancel",
            [self.keys.meta(thread_id), self.keys.lock(thread_id)],
            [thread_id],
            indexed=True,
        )
        raise_refusal(code, 0, thread_id=thread_id)
        return Status(text(status))

    def _do_take_canvas(self, thread_id: str, taker: str) -> bool:
        return bool(self._run("take_canvas", [self.keys.meta(thread_id)], [taker], indexed=False))

    def _do_put_artifact(self, thread_id: str, data: bytes) -> str | None:
        digest = hashlib.sha256(data).hexdigest()
        key = self.keys.artifact(thread_id, digest)
        keys = [key, self.keys.owned(thread_id), self.keys.meta(thread_id)]
        return digest if self._scripts["put_artifact"](keys=keys, args=[data]) else None

    def _do_get_artifact(self, thread_id: str, digest: str) -> bytes:
        data = self.client.get(self.keys.artifact(thread_id, digest))
        if data is None:
            raise ArtifactNotFound(
                f"artifact {digest} is not stored (deleted with its thread, or from another "
                "thread); keep references only within the thread that stored them",
                thread_id=thread_id,
            )
        return blob(data)

    def _do_gc(self, finished_ttl: float, statuses: frozenset[Status], limit: int | None) -> int:
        cutoff = self._now() - finished_ttl
        removed, left = 0, limit
        for status in statuses:
            if left == 0:
                break
            members = self.client.zrangebyscore(
                self.keys.status_index(status.value),
                "-inf",
                cutoff,
                start=None if left is None else 0,
                num=left,
            )
            for member in members:
                thread_id = text(member)
                if self._delete(thread_id, updated_before=cutoff, statuses=statuses):
                    removed += 1
                else:
                    # An entry its thread does not match (one a lost second call left on
                    # Cluster, or no thread at all): put right, or a limited gc would
                    # find it first every time and never get past it.
                    self.sync_index(thread_id)
            if left is not None:
                left -= len(members)
        if self.cluster:
            self._drop_entries_of_gone_threads(every=limit is None)
        return removed

    def _drop_entries_of_gone_threads(self, *, every: bool) -> None:
        """On Redis Cluster, index entries can outlive their thread: its delete's second
        call lost for good, or an earlier change's arriving after it. Those of a thread
        due somewhere the sweeper puts right when it finds them due; a waiting thread's
        would stay in its status index (and be counted) for good. Every thread the indexes
        hold has a field in the synced hash: a gc without a limit (an operator's, run once
        in a process of its own) reads all of it; a limited one (the sweeper's, every
        minute or so, in a worker that may hold a million threads) reads the next page."""
        if not every:
            self._synced_cursor = self._drop_gone_in_page(self._synced_cursor)
            return
        cursor = self._drop_gone_in_page(0)
        while cursor:
            cursor = self._drop_gone_in_page(cursor)

    def _drop_gone_in_page(self, cursor: int) -> int:
        """Take out the entries of the threads no longer there among the page of the
        synced hash at ``cursor``; return the next page's cursor, 0 after the last."""
        cursor, page = self.client.hscan(self.keys.synced(), cursor, count=_SYNCED_PAGE)
        ids = [text(thread_id) for thread_id in page]
        if ids:
            pipe = self.client.pipeline(transaction=False)
            for thread_id in ids:
                pipe.exists(self.keys.meta(thread_id))
            for thread_id, exists in zip(ids, pipe.execute(), strict=True):
                if not exists:
                    self.sync_index(thread_id)  # reads the meta again: one created since stays
        return int(cursor)

    def _do_acquire(self, thread_id: str, owner: str, ttl: float) -> int:
        return int(self._acquire(thread_id, owner, ttl, only_runnable=False)[1])

    def _do_acquire_to_run(self, thread_id: str, owner: str, ttl: float) -> Taken:
        leased, token, record, lost, _ = self._acquire(thread_id, owner, ttl, only_runnable=True)
        meta = self._meta(thread_id, hash_to_fields(record))
        return Taken(meta, int(token) if leased else None, bool(lost))

    def _acquire(self, thread_id: str, owner: str, ttl: float, *, only_runnable: bool) -> list[Any]:
        """The acquire script's reply, its refusals raised: ``[1, token, meta, lost, ops]``,
        or ``[0, 0, meta, 0, 0]`` for a thread ``only_runnable`` left unleased."""
        reply: list[Any] = self._run(
            "acquire",
            [self.keys.lock(thread_id), self.keys.meta(thread_id)],
            [thread_id, owner, _millis(ttl), "1" if only_runnable else ""],
            indexed=True,
        )
        code, value = reply[0], reply[1]
        if code == Refusal.THREAD_NOT_FOUND:
            raise ThreadNotFound(
                "cannot lease an unknown thread; start it with .delay()/.apply_async() first",
                thread_id=thread_id,
            )
        raise_refusal(code, value, thread_id=thread_id)
        return reply

    def _do_renew(self, thread_id: str, owner: str, token: int, ttl: float) -> None:
        ok, _ = self._run(
            "renew",
            [self.keys.lock(thread_id), self.keys.meta(thread_id)],
            [thread_id, f"{token}:{owner}", _millis(ttl)],
            indexed=True,
        )
        if not ok:
            raise LeaseLost(
                f"lease with token {token} expired or passed to another worker; stop "
                "driving this thread (raise lease_ttl if its steps block for long)",
                thread_id=thread_id,
            )

    def _do_renew_many(self, leases: Sequence[Renewal]) -> list[bool]:
        if not leases:
            return []
        index_keys, index_args = self._index_keys()
        replies = self._send_many(
            "renew",
            [
                (
                    [self.keys.lock(lease.thread_id), self.keys.meta(lease.thread_id), *index_keys],
                    [
                        *index_args,
                        lease.thread_id,
                        f"{lease.token}:{lease.owner}",
                        _millis(lease.ttl),
                    ],
                )
                for lease in leases
            ],
        )
        renewed = []
        for lease, reply in zip(leases, replies, strict=True):
            if isinstance(reply, Exception):
                if is_transient(reply):
                    raise reply
                # One thread's keys the script cannot read (a key of another type written
                # under the prefix) lose that lease, not every lease of the process.
                logger.error("thread %s: lease not renewable: %s", lease.thread_id, reply)
            renewed.append(not isinstance(reply, Exception) and bool(reply[0]))
        if self.cluster:
            ops = [
                reply[-1]
                for reply in replies
                if not isinstance(reply, Exception) and isinstance(reply[-1], list)
            ]
            self._run_many("index", [(self._sync_keys(), self._sync_args(op)) for op in ops])
        return renewed

    def _do_release(self, thread_id: str, owner: str, token: int) -> bool:
        return bool(
            self._scripts["release"](keys=[self.keys.lock(thread_id)], args=[f"{token}:{owner}"])
        )

    def due(self, *, limit: int = 100) -> list[tuple[str, float]]:
        entries: list[tuple[bytes, float]] = self.client.zrangebyscore(  # type: ignore[assignment]
            self.keys.due(), "-inf", self._now(), start=0, num=limit, withscores=True
        )
        return [(text(member), float(score)) for member, score in entries]

    def claim_due(self, *, hold: float, limit: int = 100) -> list[str]:
        # Named, so that the claim redis-py sends again after its reply was lost answers
        # with the threads the first run pushed ahead, rather than with none of them.
        ids = self._scripts["claim_due"](
            keys=[self.keys.due(), self.keys.claimed()], args=[hold, limit, request_id()]
        )
        return [member.decode() for member in ids]

    def _do_unclaim_due(self, thread_ids: Sequence[str]) -> None:
        self._scripts["unclaim_due"](keys=[self.keys.due()], args=list(thread_ids))

    def _do_defer_due(self, thread_id: str, fence: int, hold: float) -> None:
        self._run(
            "defer_due",
            [self.keys.meta(thread_id)],
            [thread_id, fence, hold, RESEND_SPACING_CAP],
            indexed=True,
        )

    def _do_lease_sweeper(self, owner: str, ttl: float) -> bool:
        return bool(
            self._scripts["lease_sweeper"](keys=[self.keys.sweeper()], args=[owner, _millis(ttl)])
        )

    @property
    def key_namespace(self) -> str:
        return self.keys.prefix

    def check(self) -> list[Finding]:
        return server_findings(self.client)

    def close(self) -> None:
        if isinstance(self.client, RedisCluster):
            # Its nodes do not own their pools: closing the client would leave them open.
            for node in self.client.get_nodes():  # type: ignore[no-untyped-call]
                if node.redis_connection is not None:
                    node.redis_connection.connection_pool.disconnect()
        self.client.close()

    def graph(self) -> RedisGraph:
        return RedisGraph(self.client, self.keys)
