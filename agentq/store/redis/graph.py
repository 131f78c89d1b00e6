"""The graph store on Redis-API servers: one Lua script per write, on one thread's keys.

The scripts are ``lua/graph_*.lua``, each with its contract at its top; they run after the
store's ``_prelude.lua`` (whose fence check they share) and ``_graph_prelude.lua``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgpack
import redis
from redis.cluster import RedisCluster

from agentq.errors import ThreadNotFound
from agentq.store.graph import GraphStore, lease_held, stale_token, thread_not_found
from agentq.store.graph_records import Row, StoredCheckpoint, decode_refs
from agentq.store.redis.graph_keys import GraphKeys, escape, unescape
from agentq.store.redis.keys import Keys
from agentq.store.redis.refusal import Refusal
from agentq.store.redis.scripts import load_scripts

_INDEXED_LIMIT: Final = 10_000
_SCRIPTS: Final = (
    "put",
    "put_writes",
    "get",
    "page",
    "delete",
    "delete_runs",
    "keep_latest",
    "restore",
)
_COPY_CHUNK: Final = 2000
"""Values per command of a copy: the script writing it unpacks each command into a call,
and Lua unpacks about 8000 values at most."""


def _kind(suffix: str) -> str:
    """The command that writes a LangGraph key, from its name (see graph_keys)."""
    if suffix.startswith("ids:"):
        return "ZADD"
    if suffix == "ns" or suffix.startswith("run:"):
        return "SADD"
    return "HSET"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def refusal(code: int, value: Any, thread_id: str, token: int | None) -> None:
    """Raise what a script's refusal code means (see ``lua/_graph_prelude.lua``)."""
    if code == Refusal.STALE_TOKEN:
        assert token is not None
        raise stale_token(thread_id, token, int(value))
    if code == Refusal.THREAD_NOT_FOUND:
        raise thread_not_found(thread_id)
    if code == Refusal.LEASE_HELD:
        raise lease_held(thread_id, int(value))


def index_entries(keys: GraphKeys, thread_id: str, runs: Sequence[str]) -> list[tuple[str, str]]:
    """The global index entries of a thread holding checkpoints of the (escaped) ``runs``."""
    return [
        (keys.thread_index(), thread_id),
        *((keys.run_index(unescape(run)), thread_id) for run in runs),
    ]


def unindex(client: redis.Redis | RedisCluster, entries: Sequence[tuple[str, str]]) -> None:
    """Remove ``(index key, thread id)`` entries of a thread whose data is deleted."""
    if not entries:
        return
    pipe = client.pipeline(transaction=False)
    for key, thread_id in entries:
        pipe.srem(key, thread_id)
    pipe.execute()


class RedisGraph(GraphStore):
    """On the store's client and key prefix; the connection belongs to the store."""

    def __init__(self, client: redis.Redis | RedisCluster, keys: Keys) -> None:
        self.client = client
        self.store_keys = keys
        self.keys = GraphKeys(keys)
        self._scripts = load_scripts(
            client, _SCRIPTS, ("_prelude", "_graph_prelude"), prefix="graph_"
        )
        # Global index entries this process already added: they cost a round trip once.
        self._indexed: set[str] = set()
        self._indexed_lock = threading.Lock()

    # -- plumbing -------------------------------------------------------------------------

    def _fenced(
        self, name: str, thread_id: str, token: int | None, keys: list[str], args: list[Any]
    ) -> Any:
        head = [
            self.store_keys.meta(thread_id),
            self.store_keys.lock(thread_id),
            self.store_keys.owned(thread_id),
        ]
        reply = self._scripts[name](keys=head + keys, args=["" if token is None else token, *args])
        refusal(reply[0], reply[1], thread_id, token)
        return reply[1]

    def _index(self, *entries: tuple[str, str]) -> Indexed:
        """Add ``(index key, thread id)`` entries not yet known to be there."""
        with self._indexed_lock:
            missing = [e for e in entries if f"{e[0]}\0{e[1]}" not in self._indexed]
        known = [e for e in entries if e not in missing]
        if not missing:
            return Indexed(known, [])
        pipe = self.client.pipeline(transaction=False)
        for key, thread_id in missing:
            pipe.sadd(key, thread_id)
        added = pipe.execute()
        with self._indexed_lock:
            if len(self._indexed) > _INDEXED_LIMIT:
                self._indexed.clear()
            self._indexed.update(f"{key}\0{thread_id}" for key, thread_id in missing)
        return Indexed(known, [e for e, new in zip(missing, added, strict=True) if new])

    def unindex_deleted(self, indexed: Indexed) -> None:
        """Take out the entries ``indexed`` created for a write the store refused because
        the thread was deleted meanwhile: no delete would find them. A write refused for a
        thread that lives on (a zombie's, fenced out) keeps them: its new driver may have
        found them there and counts on them, and an index may name a thread without the
        data, never miss one that has it."""
        self._unindex(*indexed.created)

    def _unindex(self, *entries: tuple[str, str]) -> None:
        unindex(self.client, entries)
        with self._indexed_lock:
            self._indexed.difference_update(f"{key}\0{tid}" for key, tid in entries)

    def _row(self, ns: str, reply: list[Any]) -> Row:
        checkpoint_id, record, refs, blobs, flat = reply
        return Row(
            ns=ns,
            checkpoint_id=_text(checkpoint_id),
            record=record,
            fields=decode_refs(refs) if refs else [],
            blobs=list(blobs),
            writes=[(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)],
        )

    # -- writes ---------------------------------------------------------------------------

    def put(self, thread_id: str, ns: str, stored: StoredCheckpoint, token: int | None) -> None:
        k = self.keys
        index = [(k.thread_index(), thread_id)]
        keys = [
            k.namespaces(thread_id),
            k.ns_key(thread_id, "ids", ns),
            k.ns_key(thread_id, "cp", ns),
            k.ns_key(thread_id, "refs", ns),
            k.ns_key(thread_id, "blob", ns),
        ]
        if stored.run_id is not None:
            index.append((k.run_index(stored.run_id), thread_id))
            keys.append(k.run(thread_id, stored.run_id))
        blobs = [item for pair in stored.blobs.items() for item in pair]
        self._indexed_write(
            index,
            lambda: self._fenced(
                "put",
                thread_id,
                token,
                keys,
                [
                    escape(ns),
                    stored.checkpoint_id,
                    stored.record,
                    stored.refs,
                    f"{escape(ns)}:{stored.checkpoint_id}",
                    "1" if stored.clears_failures else "",
                    *blobs,
                ],
            ),
        )

    def put_writes(
        self,
        thread_id: str,
        ns: str,
        checkpoint_id: str,
        writes: Sequence[tuple[bytes, bytes, bool]],
        token: int | None,
        run_id: str | None,
    ) -> None:
        k = self.keys
        keys = [k.writes(thread_id, ns, checkpoint_id), k.run_writes(thread_id, ns, checkpoint_id)]
        index = []
        if run_id is not None:
            index.append((k.run_index(run_id), thread_id))
            keys.append(k.run(thread_id, run_id))
        args = [
            f"{escape(ns)}:{checkpoint_id}",
            f"%writes:{escape(ns)}:{escape(checkpoint_id)}",
            "" if run_id is None else escape(run_id),
            *(item for f, v, replace in writes for item in (f, v, "1" if replace else "0")),
        ]
        self._indexed_write(index, lambda: self._fenced("put_writes", thread_id, token, keys, args))

    def _indexed_write(self, index: list[tuple[str, str]], write: Callable[[], Any]) -> None:
        """Add the global ``index`` entries, then ``write`` (a script replying, for each
        entry, 1 where the thread held none of its data before)."""
        indexed = self._index(*index)
        try:
            first = write()
        except ThreadNotFound:
            self.unindex_deleted(indexed)
            raise
        # An entry this process added once may have gone since with the thread's data,
        # deleted by another process: the write tells when the data starts anew.
        gone = [
            entry
            for entry, new in zip(index, first, strict=False)
            if new and entry in indexed.known
        ]
        if gone:
            with self._indexed_lock:
                self._indexed.difference_update(f"{key}\0{tid}" for key, tid in gone)
            self._index(*gone)

    # -- reads ----------------------------------------------------------------------------

    def get(
        self,
        thread_id: str,
        ns: str,
        checkpoint_id: str | None,
        channels: Collection[str] | None = None,
    ) -> Row | None:
        wanted = "" if channels is None else msgpack.packb(sorted(channels), use_bin_type=False)
        reply = self._scripts["get"](
            keys=[self.keys.ns_key(thread_id, "ids", ns)],
            args=[self.keys.base(thread_id), escape(ns), checkpoint_id or "", wanted],
        )
        return None if reply is None else self._row(ns, reply)

    def page(self, thread_id: str, ns: str, *, before: str | None, limit: int) -> list[Row]:
        replies = self._scripts["page"](
            keys=[self.keys.ns_key(thread_id, "ids", ns)],
            args=[self.keys.base(thread_id), escape(ns), before or "", limit],
        )
        return [self._row(ns, reply) for reply in replies]

    def namespaces(self, thread_id: str) -> list[str]:
        return sorted(
            unescape(_text(m)) for m in self.client.smembers(self.keys.namespaces(thread_id))
        )

    def threads(self) -> list[str]:
        return sorted(_text(m) for m in self.client.smembers(self.keys.thread_index()))

    # -- deleting and copying -------------------------------------------------------------

    def delete_thread(self, thread_id: str, token: int | None) -> None:
        runs = self._fenced("delete", thread_id, token, [], [self.keys.base(thread_id)])
        self._unindex(*index_entries(self.keys, thread_id, [_text(r) for r in runs]))

    def delete_runs(self, run_ids: Sequence[str]) -> None:
        by_thread: dict[str, list[str]] = {}
        for run_id in run_ids:
            for member in self.client.smembers(self.keys.run_index(run_id)):
                by_thread.setdefault(_text(member), []).append(run_id)
        for thread_id, runs in sorted(by_thread.items()):
            emptied, *others = self._fenced(
                "delete_runs",
                thread_id,
                None,
                [],
                [self.keys.base(thread_id), *(escape(r) for r in runs)],
            )
            entries = [(self.keys.run_index(r), thread_id) for r in runs]
            if emptied:
                # Its last checkpoint went with these runs: list(None) must not name it,
                # nor the index of a run whose writes went with the checkpoints.
                entries += index_entries(self.keys, thread_id, [_text(r) for r in others])
            self._unindex(*entries)

    def keep_latest(self, thread_id: str, keep: Mapping[str, Collection[str]]) -> None:
        kept = {escape(ns): sorted(ids) for ns, ids in keep.items() if ids}
        self._fenced(
            "keep_latest",
            thread_id,
            None,
            [self.keys.namespaces(thread_id)],
            [self.keys.base(thread_id), msgpack.packb(kept, use_bin_type=False)],
        )

    def copy_thread(self, source: str, target: str) -> None:
        copied = self.read_copy(source, target)
        if not copied.commands:
            return
        self.index_copy(target, copied)
        self._fenced("restore", target, None, [], [copied.packed()])

    def holds(self, thread_id: str, owned: Sequence[str]) -> bool:
        """Whether ``owned`` (the thread's owned set) names LangGraph keys."""
        base = self.keys.base(thread_id)
        return any(key.startswith(base) for key in owned)

    def read_copy(self, source: str, target: str) -> GraphCopy:
        """The source's LangGraph keys as commands that write them under ``target``, read
        in one ``MULTI`` (they share the source's hash tag), so that a put cannot land
        between two of them: on Cluster the target's keys are in another slot, so one
        script cannot read one and write the other. Not a script: a long thread's keys
        would keep the server from every other client while it copies them."""
        base = self.keys.base(source)
        owned = [_text(key) for key in self.client.smembers(self.store_keys.owned(source))]
        keys = sorted(key for key in owned if key.startswith(base))
        pipe = self.client.pipeline(transaction=True)
        kinds = [_kind(key[len(base) :]) for key in keys]
        for key, kind in zip(keys, kinds, strict=True):
            if kind == "HSET":
                pipe.hgetall(key)
            elif kind == "ZADD":
                pipe.zrange(key, 0, -1)
            else:
                pipe.smembers(key)
        commands: list[list[Any]] = []
        runs: list[str] = []
        target_base = self.keys.base(target)
        for key, kind, found in zip(keys, kinds, pipe.execute() if keys else [], strict=True):
            suffix = key[len(base) :]
            if kind == "HSET":
                values = [x for pair in found.items() for x in pair]
            elif kind == "ZADD":
                values = [x for member in found for x in (0, member)]
            else:
                values = sorted(found)
            for start in range(0, len(values), _COPY_CHUNK):
                commands.append([kind, target_base + suffix, *values[start : start + _COPY_CHUNK]])
            if suffix.startswith("run:"):
                runs.append(unescape(suffix[len("run:") :]))
        return GraphCopy(commands, runs)

    def index_copy(self, target: str, copied: GraphCopy) -> Indexed:
        """Index ``target`` for a copy about to be written: before, so that the indexes
        never miss a thread holding data (see :mod:`~agentq.store.redis.graph_keys`)."""
        k = self.keys
        return self._index(
            (k.thread_index(), target), *((k.run_index(r), target) for r in copied.runs)
        )


@dataclass(frozen=True)
class Indexed:
    """What adding global index entries ahead of a write did."""

    known: list[tuple[str, str]]
    """Entries skipped: this process had added them before."""
    created: list[tuple[str, str]]
    """Entries this call created, which a refused write must take out again."""


@dataclass(frozen=True)
class GraphCopy:
    """A thread's LangGraph keys as read for writing under another thread id."""

    commands: list[list[Any]]
    """``[command, key, args...]`` for ``graph_restore.lua`` or ``create_fork.lua``, which
    also add each key to the target's owned set."""
    runs: list[str]
    """The run ids whose sets are copied, for the global run index."""

    def packed(self) -> bytes:
        packed: bytes = msgpack.packb(self.commands, use_bin_type=False)
        return packed
