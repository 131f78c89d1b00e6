"""A thread leaving its concurrency key wakes waiters by the cap declared now; a thread
whose cancel comes between its driver's take and its entry is cancelled, not parked."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from agentq import Status
from agentq.engine.driver import Driver
from agentq.engine.store_retry import RetriedCalls
from agentq.engine.thread_keys import KeySeat, leave
from agentq.records import ThreadMeta
from agentq.settings import Settings
from agentq.store.redis.store import RedisStore
from agentq.store.sqlite.store import SQLiteStore
from tests.support.mailer import Mailer
from tests.support.redis_server import RedisServer


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


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[RedisStore]:
    with RedisStore.from_url(redis_server.url, prefix=f"tk{uuid.uuid4().hex[:8]}:") as made:
        yield made


def test_a_thread_cancelled_after_its_take_is_cancelled_before_its_key_not_parked(
    store: RedisStore,
) -> None:
    """``cancel()`` finds the thread running under its new lease and only flags it; its
    driver, entering the full key next, cancels it there. Parked, it would have waited
    queued, flag and all, for its turn, and its task would have ended waiting for it."""
    agent = Mailer(store)
    store.open_thread("holder", task=agent.name)
    holder = store.acquire("holder", "elsewhere", 60)
    assert store.enter_key("holder", "elsewhere", holder, "tenant:1", 1) == 0
    store.open_thread("victim", task=agent.name)
    sent: list[str] = []

    def seat_of(meta: ThreadMeta) -> KeySeat:
        # Asked for by the driver after its take, before it enters the key: the window.
        assert store.request_cancel("victim") == Status.RUNNING  # so only flagged
        return KeySeat("tenant:1", 1, start_grace=30, wake=sent.extend)

    driver = Driver(agent, "victim", store, Settings(store=store), lambda: False, seat_of=seat_of)
    assert driver.drive() is None
    assert driver.waiting_for is None
    meta = store.meta("victim")
    assert meta is not None and meta.status == Status.CANCELLED
    assert agent.sent() == []  # its node never ran
    (state,) = store.key_states()
    assert (state.running, state.waiting) == (["holder"], [])
    assert store.schedules(["victim"])[0].owner is None  # its lease given up
