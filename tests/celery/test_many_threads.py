"""Many threads in flight on one in-process worker: bounded connections, one lease each."""

from __future__ import annotations

from pathlib import Path

import redis

from agentq import Status
from tests.support.redis_server import RedisServer, running_redis, wait_until
from tests.support.threads_worker import PeakClients, statuses, threads_worker


def test_fifty_threads_share_a_handful_of_connections(redis_broker: str, tmp_path: Path) -> None:
    thread_ids = [f"t{n}" for n in range(50)]
    with (
        running_redis(tmp_path / "store") as server,
        PeakClients(server.url) as clients,
        threads_worker(redis_broker, server.url, concurrency=50, max_connections=4) as (app, store),
    ):
        agent = app.tasks["tests.waiting_agent"]
        for thread_id in thread_ids:
            agent.delay(thread_id, steps=3, wait=0.3)
        wait_until(
            lambda: set(statuses(store, thread_ids).values()) == {Status.DONE},
            timeout=60,
            what="all 50 threads done",
        )
        assert all(store.meta(t).crashes == 0 for t in thread_ids)  # type: ignore[union-attr]
    # The worker's pool (its steps, the lease keeper and the sweeper) stayed in its bound.
    assert 0 < clients.peak <= 4


def test_a_stolen_lease_stops_that_thread_alone(
    redis_broker: str, redis_server: RedisServer
) -> None:
    thread_ids = [f"t{n}" for n in range(21)]
    with threads_worker(redis_broker, redis_server.url, concurrency=21) as (app, store):
        agent = app.tasks["tests.waiting_agent"]
        for thread_id in thread_ids:
            agent.delay(thread_id, steps=5, wait=0.4)
        stolen, others = thread_ids[0], thread_ids[1:]
        wait_until(lambda: store.meta(stolen).step >= 0, timeout=30, what="a first commit")  # type: ignore[union-attr]
        lock_key = f"{app._agentq_runtime.settings.prefix}thread:{{{stolen}}}:lock"
        token, owner = redis.Redis.from_url(redis_server.url).get(lock_key).decode().split(":", 1)  # type: ignore[union-attr]
        assert store.release(stolen, owner, int(token))
        thief = store.acquire(stolen, "thief", 60)
        step_when_stolen = store.meta(stolen).step  # type: ignore[union-attr]
        wait_until(
            lambda: set(statuses(store, others).values()) == {Status.DONE},
            timeout=60,
            what="the 20 others done",
        )
        # Well past a renewal beat (lease_ttl / 3) and a step: the old driver has met its
        # boundary, found the lease gone and committed nothing more.
        latest = store.latest(stolen)
        meta = store.meta(stolen)
        assert meta is not None and latest is not None
        assert (meta.status, meta.fence, meta.step) == (Status.RUNNING, thief, step_when_stolen)
        assert latest.token == int(token)
