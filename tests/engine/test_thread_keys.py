"""A thread leaving its concurrency key wakes waiters by the cap declared now."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agentq.engine.store_retry import RetriedCalls
from agentq.engine.thread_keys import KeySeat, leave
from agentq.store.sqlite.store import SQLiteStore


def test_a_driver_leaving_under_a_raised_cap_starts_every_waiter_it_allows(
    tmp_path: Path,
) -> None:
    """The waiters entered under threads=1; the deploy leaving the key says 3. Woken by
    the stored cap, one would start now and two slots would wait for the next sweep."""
    with SQLiteStore(tmp_path / "agentq.db") as store:
        tokens = {}
        for thread_id in ("a", "b", "c", "d"):
            store.open_thread(thread_id, task="t", start_grace=60)
            tokens[thread_id] = store.acquire(thread_id, "old", 60)
            store.enter_key(thread_id, "old", tokens[thread_id], "tenant:1", 1)
        sent: list[str] = []

        def wake(thread_ids: Sequence[str]) -> None:
            sent.extend(thread_ids)

        seat = KeySeat("tenant:1", 3, start_grace=30, wake=wake)
        leave(RetriedCalls(store, "a", lease_ttl=60), tokens["a"], seat)
        assert sent == ["b", "c", "d"]
