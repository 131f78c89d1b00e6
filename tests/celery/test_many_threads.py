"""Many threads in flight on one in-process worker: bounded connections, one lease each."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker

from agentq import Status
from agentq.store.contract import Store
from tests.support.agents import make_app
from tests.support.redis_server import RedisServer, running_redis, wait_until


@contextlib.contextmanager
def worker(
    broker: str, store_url: str, *, concurrency: int, **settings: Any
) -> Iterator[tuple[Celery, Store]]:
    prefix = f"mt{uuid.uuid4().hex[:8]}:"
    app = make_app(
        broker=broker,
        store=store_url,
        prefix=prefix,
        queue=f"agentq-test-{prefix}",
        ledger_url=store_url,
        lease_ttl=3,
        sweep_interval=0.5,
        start_grace=30,
        **settings,
    )
    store: Store = app._agentq_runtime.store
    with start_worker(
        app, pool="threads", concurrency=concurrency, perform_ping_check=False, shutdown_timeout=30
    ):
        yield app, store
    store.close()
    app.close()


def statuses(store: Store, thread_ids: list[str]) -> dict[str, Status]:
    return {t: meta.status for t in thread_ids if (meta := store.meta(t)) is not None}


class PeakClients:
    """Samples a server's connected clients until stopped; ``peak`` excludes its own."""

    def __init__(self, url: str) -> None:
        self._client = redis.Redis.from_url(url)
        self._stop = threading.Event()
        self.peak = 0
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PeakClients:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._client.close()

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            clients = int(self._client.info("clients")["connected_clients"]) - 1
            self.peak = max(self.peak, clients)


def test_fifty_threads_share_a_handful_of_connections(redis_broker: str, tmp_path: Path) -> None:
    thread_ids = [f"t{n}" for n in range(50)]
    with (
        running_redis(tmp_path / "store") as server,
        PeakClients(server.url) as clients,
        worker(redis_broker, server.url, concurrency=50, max_connections=4) as (app, store),
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
    with worker(redis_broker, redis_server.url, concurrency=21) as (app, store):
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
