"""Store backends: Redis (and Redis-API servers) and SQLite."""

from __future__ import annotations

from typing import Any

from agentq.errors import StoreConfigError
from agentq.store.contract import Store


def open_store(url: str, **options: Any) -> Store:
    """Open the store a URL names: ``redis://``, ``rediss://``, ``unix://`` or ``sqlite:///``.

    ``options`` go to the backend (``prefix`` applies to Redis only).
    """
    if url.startswith("sqlite:"):
        from agentq.store.sqlite.store import SQLiteStore

        # One connection serves a process's threads; these two are Redis's alone.
        options.pop("prefix", None)
        options.pop("max_connections", None)
        return SQLiteStore.from_url(url, **options)
    if url.startswith(("redis://", "rediss://", "unix://")):
        from agentq.store.redis.store import RedisStore

        return RedisStore.from_url(url, **options)
    raise StoreConfigError(
        f"unsupported store URL {url!r}; use redis://, rediss://, unix:// or sqlite:///path"
    )


__all__ = ["Store", "open_store"]
