"""``AgentqSaver``: LangGraph's checkpointer on agentq's stores, refusing stale writers."""

from __future__ import annotations

import copy
import heapq
import random
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, Self, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    PendingWrite,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from agentq.engine import aio
from agentq.errors import (
    CheckpointTooLarge,
    CodecError,
    CorruptCheckpoint,
    InvalidArgument,
    UnserializableState,
)
from agentq.ids import validate_thread_id
from agentq.langgraph.schema import graph_types
from agentq.langgraph.serde import safe_serde
from agentq.store import graph_records as records
from agentq.store import open_store
from agentq.store.contract import Store
from agentq.store.graph import GraphStore
from agentq.store.graph_records import Row, StoredCheckpoint

_PAGE = 100
_DONE = object()


class AgentqSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer that keeps checkpoints in an agentq store.

    Works on any Redis-API server with Lua (no Redis modules) and on agentq's SQLite file.
    Construct it with :meth:`from_url` or from a store object, and compile a graph with
    ``checkpointer=saver``. Channel values are stored once per version, through LangGraph's
    serde protocol but never as pickle (see :mod:`agentq.langgraph.serde`).

    Single writer: a graph task binds the saver to its lease (:meth:`bound`), and every
    write then carries the lease's fencing token; the store refuses it with
    :class:`~agentq.errors.StaleToken` once another worker holds the thread. An unbound
    saver may write a thread only while no graph task holds its lease
    (:class:`~agentq.errors.LeaseHeld` otherwise), so ``update_state`` on a waiting thread
    works and on a running one is refused.
    """

    def __init__(
        self,
        store: Store,
        *,
        serde: SerializerProtocol | None = None,
        owns_store: bool = False,
    ) -> None:
        super().__init__(serde=safe_serde(serde))
        self.store = store
        self.backend: GraphStore = store.graph()
        self._owns_store = owns_store
        self._bound: tuple[str, int] | None = None
        self._got_past: Callable[[], None] | None = None

    @classmethod
    def from_url(
        cls, url: str, *, serde: SerializerProtocol | None = None, **store_options: Any
    ) -> AgentqSaver:
        """Open ``redis://…``, ``rediss://…``, ``unix://…`` or ``sqlite:///…``;
        ``store_options`` (``prefix``, …) go to :func:`agentq.open_store`. The saver owns
        that store and closes it with :meth:`close` (or ``with``)."""
        return cls(open_store(url, **store_options), serde=serde, owns_store=True)

    def for_graph(self, graph: Any) -> AgentqSaver:
        """A copy that revives the pydantic models, dataclasses and enums ``graph`` (a
        ``StateGraph`` or a compiled graph) declares in its state and channels; compile the
        graph with it: ``builder.compile(checkpointer=saver.for_graph(builder))``."""
        return cast(AgentqSaver, self.with_allowlist(graph_types(graph)))

    def bound(
        self, thread_id: str, token: int, *, got_past: Callable[[], None] | None = None
    ) -> AgentqSaver:
        """A copy whose writes to ``thread_id`` carry fencing ``token``; it refuses to
        write any other thread. With ``got_past``, its first checkpoint of the graph's own
        loop (a super-step done) clears the thread's failed attempts and lost workers, as
        a commit does, and then calls ``got_past``."""
        clone = copy.copy(self)
        clone._bound = (validate_thread_id(thread_id), token)
        clone._got_past = got_past
        return clone

    def close(self) -> None:
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- helpers --------------------------------------------------------------------------

    def _token(self, thread_id: str) -> int | None:
        if self._bound is None:
            return None
        bound_thread, token = self._bound
        if thread_id != bound_thread:
            raise InvalidArgument(
                f"this saver is bound to thread {bound_thread!r} by its graph task and "
                "cannot write another thread; use an unbound AgentqSaver for that",
                thread_id=thread_id,
            )
        return token

    def _dumps(
        self, value: Any, what: str, thread_id: str, step: int | None = None
    ) -> tuple[str, bytes]:
        try:
            return self.serde.dumps_typed(value)
        except CodecError:
            raise
        except Exception as exc:
            raise UnserializableState(
                f"{what}: {type(value).__name__} cannot be serialised by LangGraph's msgpack "
                f"serde ({exc}); keep plain data, pydantic models or dataclasses in the state",
                path=what,
                thread_id=thread_id,
                step=step,
            ) from exc

    def _loads(self, typed: tuple[str, bytes], what: str, thread_id: str) -> Any:
        try:
            return self.serde.loads_typed(typed)
        except CodecError:
            raise
        except Exception as exc:
            raise CorruptCheckpoint(
                f"{what} does not load ({type(exc).__name__}: {exc}); it was not written by "
                "agentq or was damaged",
                thread_id=thread_id,
            ) from exc

    def _tuple(
        self, thread_id: Any, row: Row, metadata: Any, record: records.Record
    ) -> CheckpointTuple:
        tid = str(thread_id)
        checkpoint = self._loads(record.checkpoint, "checkpoint", tid)
        values: dict[str, Any] = {}
        for field, blob in zip(row.fields, row.blobs, strict=True):
            if blob is None:
                continue
            typed = records.decode_blob(blob)
            if typed[0] == "empty":  # a channel cleared at this version
                continue
            channel = records.field_channel(field)
            values[channel] = self._loads(typed, f"channel {channel!r}", tid)
        writes: list[tuple[tuple[str, str, int], PendingWrite]] = []
        for field, value in row.writes:
            task_id, idx = records.decode_write_field(field)
            channel, typed, task_path = records.decode_write(value)
            loaded = self._loads(typed, f"pending write to {channel!r}", tid)
            writes.append((writes_sort_key(task_path, task_id, idx), (task_id, channel, loaded)))
        writes.sort(key=lambda item: item[0])

        def config(checkpoint_id: str) -> RunnableConfig:
            return {
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": row.ns,
                    "checkpoint_id": checkpoint_id,
                }
            }

        return CheckpointTuple(
            config=config(row.checkpoint_id),
            checkpoint=cast(Checkpoint, {**checkpoint, "channel_values": values}),
            metadata=metadata,
            parent_config=config(record.parent_id) if record.parent_id else None,
            pending_writes=[write for _, write in writes],
        )

    def _decode(self, thread_id: str, row: Row) -> tuple[records.Record, Any]:
        record = records.decode_record(
            row.record, thread_id=thread_id, checkpoint_id=row.checkpoint_id
        )
        return record, self._loads(record.metadata, "metadata", thread_id)

    def _rows(self, thread_id: str, ns: str, before: str | None, page: int) -> Iterator[Row]:
        while True:
            rows = self.backend.page(thread_id, ns, before=before, limit=page)
            yield from rows
            if len(rows) < page:
                return
            before = rows[-1].checkpoint_id

    # -- the saver contract ---------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id, ns = _target(config)
        # An empty id is no id, as LangGraph's own savers read it.
        row = self.backend.get(thread_id, ns, get_checkpoint_id(config) or None)
        if row is None:
            return None
        record, metadata = self._decode(thread_id, row)
        return self._tuple(config["configurable"]["thread_id"], row, metadata, record)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Newest first (by checkpoint id) within a thread, across its namespaces unless
        the config names one; with no config, every thread in id order."""
        if limit is not None and limit <= 0:
            return
        before_id = (get_checkpoint_id(before) or None) if before else None
        exact_id = (get_checkpoint_id(config) or None) if config else None
        if config is None:
            threads: list[Any] = list(self.backend.threads())
            ns_given = None
        else:
            threads = [config["configurable"]["thread_id"]]
            ns_given = config["configurable"].get("checkpoint_ns")
        page = _PAGE if filter or limit is None else min(limit, _PAGE)
        left = limit
        for thread in threads:
            thread_id = validate_thread_id(str(thread))
            spaces = [ns_given] if ns_given is not None else self.backend.namespaces(thread_id)
            streams = [self._rows(thread_id, ns, before_id, page) for ns in spaces]
            for row in heapq.merge(*streams, key=lambda r: r.checkpoint_id, reverse=True):
                if exact_id and row.checkpoint_id != exact_id:
                    continue
                record, metadata = self._decode(thread_id, row)
                if filter and not all(metadata.get(k) == v for k, v in filter.items()):
                    continue
                yield self._tuple(thread, row, metadata, record)
                if left is not None:
                    left -= 1
                    if left == 0:
                        return

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """LangGraph's walk up the parent chain, reading of each ancestor only the
        channels still looking for their snapshot, not its whole state."""
        if not channels:
            return {}
        thread_id, ns = _target(config)
        collected: dict[str, list[PendingWrite]] = {c: [] for c in channels}
        seeds: dict[str, Any] = {}
        waiting = set(channels)
        row = self.backend.get(thread_id, ns, get_checkpoint_id(config) or None, ())
        parent = None if row is None else self._parent(thread_id, row)
        while parent is not None and waiting:
            row = self.backend.get(thread_id, ns, parent, waiting)
            if row is None:
                break
            writes = []
            for field, value in row.writes:
                channel, typed, task_path = records.decode_write(value)
                if channel in waiting:
                    task_id, idx = records.decode_write_field(field)
                    writes.append(
                        (writes_sort_key(task_path, task_id, idx), task_id, channel, typed)
                    )
            writes.sort(key=lambda item: item[0])
            for _, task_id, channel, typed in reversed(writes):
                loaded = self._loads(typed, f"pending write to {channel!r}", thread_id)
                collected[channel].append((task_id, channel, loaded))
            for field, blob in zip(row.fields, row.blobs, strict=True):
                typed = records.decode_blob(blob) if blob is not None else ("empty", b"")
                channel = records.field_channel(field)
                if typed[0] != "empty" and channel in waiting:
                    seeds[channel] = self._loads(typed, f"channel {channel!r}", thread_id)
                    waiting.discard(channel)
            parent = self._parent(thread_id, row)
        history: dict[str, DeltaChannelHistory] = {}
        for channel in channels:
            entry: DeltaChannelHistory = {"writes": collected[channel][::-1]}
            if channel in seeds:
                entry["seed"] = seeds[channel]
            history[channel] = entry
        return history

    def _parent(self, thread_id: str, row: Row) -> str | None:
        record = records.decode_record(
            row.record, thread_id=thread_id, checkpoint_id=row.checkpoint_id
        )
        return record.parent_id

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        thread_id, ns = _target(config)
        stored: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = stored.pop("channel_values", {})
        # LangGraph's step of this checkpoint, as get_state_history shows it.
        step = metadata.get("step")
        blobs = {}
        for channel, version in new_versions.items():
            typed = (
                self._dumps(values[channel], f"channel {channel!r}", thread_id, step)
                if channel in values
                else ("empty", b"")
            )
            blobs[records.blob_field(channel, version)] = records.encode_blob(typed)
        full_metadata = get_checkpoint_metadata(config, metadata)
        run_id = full_metadata.get("run_id")
        record = records.encode_record(
            self._dumps(stored, "checkpoint", thread_id),
            self._dumps(full_metadata, "metadata", thread_id),
            get_checkpoint_id(config),
        )
        self._check_size(thread_id, step, record, blobs)
        refs = [records.blob_field(c, v) for c, v in checkpoint["channel_versions"].items()]
        got_past = self._got_past
        clears = got_past is not None and metadata.get("source") == "loop"
        self.backend.put(
            thread_id,
            ns,
            StoredCheckpoint(
                checkpoint_id=checkpoint["id"],
                record=record,
                refs=records.encode_refs(refs),
                run_id=None if run_id is None else str(run_id),
                blobs=blobs,
                clears_failures=clears,
            ),
            self._token(thread_id),
        )
        if clears and got_past is not None:
            self._got_past = None
            got_past()
        return {
            "configurable": {
                "thread_id": config["configurable"]["thread_id"],
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    def _check_size(
        self, thread_id: str, step: int | None, record: bytes, blobs: Mapping[bytes, bytes]
    ) -> None:
        """Refuse, before anything is written, a checkpoint over the store's
        ``max_checkpoint_bytes``, as an agent's is: what a super-step stores, its record and
        the channel values it changed."""
        size = len(record) + sum(len(blob) for blob in blobs.values())
        limit = self.store.max_checkpoint_bytes
        if size > limit:
            raise CheckpointTooLarge(
                f"LangGraph checkpoint is {size} bytes (its record and the channel values "
                f"it writes), over the limit of {limit}; keep large data (documents, files, "
                "images) out of the graph's state: store it elsewhere (in a graph task, "
                "current_run().artifacts.put(data)) and keep the returned reference, or "
                "raise max_checkpoint_bytes",
                size=size,
                limit=limit,
                thread_id=thread_id,
                step=step,
            )

    def _check_writes_size(
        self,
        thread_id: str,
        checkpoint_id: str,
        task_id: str,
        task_path: str,
        rows: Sequence[tuple[bytes, bytes, bool]],
    ) -> None:
        """Refuse, before anything is written, one task's pending writes over the store's
        ``max_checkpoint_bytes``: they become the next checkpoint's channel values, which
        :meth:`_check_size` would refuse, and until then they would sit in the store.
        The error names no step: LangGraph may still be storing the checkpoint that
        would tell it."""
        size = sum(len(field) + len(value) for field, value, _ in rows)
        limit = self.store.max_checkpoint_bytes
        if size > limit:
            # LangGraph's path of a node's own task: "~__pregel_pull, <node>".
            kind, _, node = task_path.partition(", ")
            task = f"node {node!r}" if kind == "~__pregel_pull" else f"task {task_id!r}"
            raise CheckpointTooLarge(
                f"LangGraph {task} writes {size} bytes after checkpoint {checkpoint_id}, "
                f"over the limit of {limit}; keep large data (documents, files, images) "
                "out of the graph's state: store it elsewhere (in a graph task, "
                "current_run().artifacts.put(data)) and return the reference, or raise "
                "max_checkpoint_bytes",
                size=size,
                limit=limit,
                thread_id=thread_id,
            )

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        thread_id, ns = _target(config)
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id is None:
            raise InvalidArgument(
                "put_writes needs the checkpoint_id the writes belong to in the config",
                thread_id=thread_id,
            )
        rows = []
        for idx, (channel, value) in enumerate(writes):
            # Special writes (errors, interrupts, resumes) have fixed negative indexes and
            # the latest one wins; a regular write, once stored, is kept (first wins).
            index = WRITES_IDX_MAP.get(channel, idx)
            typed = self._dumps(value, f"pending write to {channel!r}", thread_id)
            rows.append(
                (
                    records.write_field(task_id, index),
                    records.encode_write(channel, typed, task_path),
                    index < 0,
                )
            )
        self._check_writes_size(thread_id, checkpoint_id, task_id, task_path, rows)
        if rows:
            # The run LangGraph was invoked for, as put records it for its checkpoints.
            run_id = get_checkpoint_metadata(config, {}).get("run_id")
            self.backend.put_writes(
                thread_id,
                ns,
                checkpoint_id,
                rows,
                self._token(thread_id),
                None if run_id is None else str(run_id),
            )

    def delete_thread(self, thread_id: str) -> None:
        tid = validate_thread_id(str(thread_id))
        self.backend.delete_thread(tid, self._token(tid))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self.backend.delete_runs([str(r) for r in run_ids])

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self.backend.copy_thread(
            validate_thread_id(str(source_thread_id)), validate_thread_id(str(target_thread_id))
        )

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest`` keeps each namespace's latest checkpoint with its writes and the
        blobs it reads, and the ancestors LangGraph rebuilds its ``DeltaChannel`` values
        from (back to each one's snapshot); ``delete`` removes the threads' checkpoints
        altogether."""
        if strategy not in ("keep_latest", "delete"):
            raise InvalidArgument(
                f"unknown prune strategy {strategy!r}; use 'keep_latest' or 'delete'"
            )
        for thread in thread_ids:
            thread_id = validate_thread_id(str(thread))
            if strategy == "delete":
                self.backend.delete_thread(thread_id, self._token(thread_id))
            else:
                spaces = self.backend.namespaces(thread_id)
                keep = {ns: self._rebuilt_from(thread_id, ns) for ns in spaces}
                self.backend.keep_latest(thread_id, keep)

    def _rebuilt_from(self, thread_id: str, ns: str) -> Sequence[str]:
        """The namespace's latest checkpoint and the ancestors whose writes LangGraph
        replays to rebuild its ``DeltaChannel`` values, back to one storing a snapshot of
        each. The latest is named too: should a put land meanwhile, the new latest's chain
        runs through it."""
        row = self.backend.get(thread_id, ns, None)
        if row is None:
            return []
        record, metadata = self._decode(thread_id, row)
        # LangGraph counts the updates since the last snapshot of each delta channel.
        waiting = set(metadata.get("counters_since_delta_snapshot") or ()) - _stored(row)
        chain = [row.checkpoint_id]
        parent = record.parent_id
        while waiting and parent is not None:
            found = self.backend.get(thread_id, ns, parent)
            if found is None:
                break
            chain.append(found.checkpoint_id)
            waiting -= _stored(found)
            parent = self._parent(thread_id, found)
        return chain

    def get_next_version(self, current: str | None, channel: None) -> str:
        # As LangGraph's own savers: a zero-padded counter sorts as text too; the random
        # suffix keeps versions from two branches of a fork apart.
        number = 0 if current is None else int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    # -- async twins: the same calls off the loop (in the node's pool slot under agentq) --

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await aio.blocking(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        items = self.list(config, filter=filter, before=before, limit=limit)
        while (item := await aio.blocking(next, items, _DONE)) is not _DONE:
            assert isinstance(item, CheckpointTuple)
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await aio.blocking(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await aio.blocking(self.put_writes, config, writes, task_id, task_path)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return await aio.blocking(self.get_delta_channel_history, config=config, channels=channels)

    async def adelete_thread(self, thread_id: str) -> None:
        await aio.blocking(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await aio.blocking(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await aio.blocking(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await aio.blocking(self.prune, thread_ids, strategy=strategy)


def _stored(row: Row) -> set[str]:
    """The channels whose value the checkpoint stores: not one cleared at its version, nor
    a ``DeltaChannel`` between two snapshots."""
    return {
        records.field_channel(field)
        for field, blob in zip(row.fields, row.blobs, strict=True)
        if blob is not None and records.decode_blob(blob)[0] != "empty"
    }


def _target(config: RunnableConfig) -> tuple[str, str]:
    """The thread id (validated as agentq's) and namespace a config names."""
    configurable = config.get("configurable") or {}
    if configurable.get("thread_id") is None:
        raise InvalidArgument(
            "the config has no configurable.thread_id; invoke the graph with "
            "{'configurable': {'thread_id': ...}}"
        )
    thread_id = validate_thread_id(str(configurable["thread_id"]))
    return thread_id, configurable.get("checkpoint_ns") or ""
