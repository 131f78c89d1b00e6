"""The Redis store: Redis 7 and Redis-API servers with Lua (Valkey, KeyDB, Dragonfly)."""

from agentq.store.redis.store import RedisStore

__all__ = ["RedisStore"]
