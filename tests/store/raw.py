"""Backend-level access for tests: raw writes and whole-store snapshots."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from typing import Any

from redis.cluster import RedisCluster

from agentq.store.contract import Store
from agentq.store.redis.store import RedisStore


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
