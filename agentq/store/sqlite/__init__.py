"""The embedded store: one SQLite file, for one machine."""

from agentq.store.sqlite.store import SQLiteStore

__all__ = ["SQLiteStore"]
