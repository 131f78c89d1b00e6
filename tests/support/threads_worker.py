"""An in-process threads-pool worker with many threads in flight, and what to watch."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker

from agentq import Status
from agentq.store.contract import Store
from tests.support.agents import make_app


@contextlib.contextmanager
def threads_worker(
    broker: str, store_url: str, *, concurrency: int, **settings: Any
) -> Iterator[tuple[Celery, Store]]:
    prefix = f"mt{uuid.uuid4().hex[:8]}:"
    app = make_app(
        broker=broker,
        store=store_url,
        prefix=prefix,
        queue=f"agentq-test-{prefix}",
        ledger_url=store_url,
        **{"lease_ttl": 3, "sweep_interval": 0.5, "start_grace": 30, **settings},
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
