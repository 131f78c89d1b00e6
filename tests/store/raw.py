"""Backend-level access for tests: raw writes and whole-store snapshots."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from typing import Any

from redis.cluster import RedisCluster

from agentq.store.contract import Store
from agentq.store.redis.store import RedisStore
from agentq.store.sqlite.store import SQLiteStore


@contextmanager
def same_data(store: Store, *, shared_effect_ttl: float) -> Iterator[Store]:
    """Another store on ``store``'s data, opened as a worker with another ``finished_ttl``
    setting opens it."""
    if isinstance(store, RedisStore):
        # On the fixture's client, which the fixture closes.
        yield RedisStore(
            store.client,
            prefix=store.keys.prefix,
            keep_last=store.keep_last,
            shared_effect_ttl=shared_effect_ttl,
        )
    else:
        assert isinstance(store, SQLiteStore)
        with SQLiteStore(
            store.path, keep_last=store.keep_last, shared_effect_ttl=shared_effect_ttl
        ) as other:
            yield other


def overwrite_checkpoint(store: Store, thread_id: str, step: int, data: bytes) -> None:
    """Replace the stored bytes of one checkpoint, as disk damage or an old bug would."""
    if isinstance(store, RedisStore):
        store.client.set(store.keys.checkpoint(thread_id, step), data)
    else:
        path = store.path  # type: ignore[attr-defined]
        with closing(sqlite3.connect(path)) as db, db:
            db.execute(
                "UPDATE checkpoints SET data = ? WHERE thread_id = ? AND step = ?",
                (data, thread_id, step),
            )


def snapshot(store: Store) -> Any:
    """Everything the store holds, comparable with ``==``."""
    if isinstance(store, RedisStore):
        client = store.client
        if isinstance(client, RedisCluster):
            keys = client.keys(f"{store.keys.prefix}*", target_nodes=RedisCluster.ALL_NODES)
        else:
            keys = client.keys(f"{store.keys.prefix}*")
        return {key: (client.type(key), client.dump(key)) for key in sorted(set(keys))}
    with closing(sqlite3.connect(store.path)) as db:  # type: ignore[attr-defined]
        tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {t: sorted(db.execute(f"SELECT * FROM {t}").fetchall()) for t in tables}


def drop_shared_copy(store: Store, thread_id: str, key: str) -> None:
    """Remove a thread's copy of a shared outcome, as a worker killed between completing
    the shared record and keeping the copy (two steps on Redis Cluster) leaves it."""
    if isinstance(store, RedisStore):
        copy = store.keys.shared_copy(thread_id, key)
        store.client.delete(copy)
        store.client.srem(store.keys.owned(thread_id), copy)
    else:
        with closing(sqlite3.connect(store.path)) as db, db:  # type: ignore[attr-defined]
            db.execute(
                'DELETE FROM shared_copies WHERE thread_id = ? AND "key" = ?', (thread_id, key)
            )
