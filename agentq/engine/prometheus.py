"""agentq's counters and collectors in ``prometheus_client``: imported by
:mod:`agentq.engine.metrics` when a process first records or serves metrics, so that
importing agentq neither loads prometheus_client nor registers anything in its default
registry."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, multiprocess
from prometheus_client import start_http_server as _serve
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from agentq.errors import ConfigError
from agentq.records import Status
from agentq.store.contract import Store

logger = logging.getLogger("agentq")

COUNTERS = CollectorRegistry()
"""agentq's own counters, kept out of the default registry: reading them runs none of the
application's collectors, so it can be done under the lock a fork waits for."""

STEPS = Counter("agentq_steps_committed", "Steps committed", registry=COUNTERS)
COMMIT_SECONDS = Histogram(
    "agentq_commit_seconds",
    "Time to commit a step",
    # From a fraction of a millisecond, where a healthy store's commits fall:
    # prometheus_client's default buckets start at 5 ms, so a store slowing from
    # 0.3 to 4 ms would not move a quantile.
    buckets=(0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
    registry=COUNTERS,
)
LEASES_LOST = Counter(
    "agentq_leases_lost", "Leases a worker lost while driving a thread", registry=COUNTERS
)
TAKEOVERS = Counter(
    "agentq_takeovers", "Threads taken over from a worker that was lost", registry=COUNTERS
)
RECOVERIES = Counter("agentq_recoveries", "Due threads re-sent by the sweeper", registry=COUNTERS)
RETRIES = Counter("agentq_retries", "Steps scheduled to retry", ["cause"], registry=COUNTERS)


class _Counters(Collector):
    """agentq's counters as the default registry shows them, read under ``lock``, the lock
    a fork waits for: reading a counter holds prometheus_client's lock on it, which a child
    forked meanwhile would inherit held. Read whole inside the lock and handed out after,
    so that the fork waits for agentq's counters only, never for the collectors read
    beside them."""

    def __init__(self, lock: AbstractContextManager[Any]) -> None:
        self._lock = lock

    def describe(self) -> list[Any]:
        # The default registry notes these names, and so refuses another metric of one of
        # them, as it did when the counters were registered in it directly.
        return self.collect()

    def collect(self) -> list[Any]:
        with self._lock:
            return list(COUNTERS.collect())


def show_counters(lock: AbstractContextManager[Any]) -> None:
    """Show agentq's counters in the default registry: the application's own exposition of
    it, and this process's scrape, read them there."""
    REGISTRY.register(_Counters(lock))


class StoreCollector(Collector):
    """Threads by status, ``needs_attention`` and the due index's lag, read from the
    store's indexes when scraped (never a scan of the threads)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def describe(self) -> list[Any]:
        return []  # read at scrape time only: registering must not reach the store

    def collect(self) -> Iterator[Any]:
        try:
            counts = self.store.status_counts()
            oldest = self.store.due(limit=1)
        except Exception as exc:
            if not self.store.is_transient(exc):
                raise
            # Left out, as Prometheus expects of series it cannot read: failing the
            # scrape would hide the worker's own counters, served beside them, for as
            # long as the outage they tell about lasts.
            logger.warning(
                "metrics: the store's gauges are left out of this scrape: the store is "
                "unreachable (%s: %s)",
                type(exc).__name__,
                exc,
            )
            return
        by_status = GaugeMetricFamily("agentq_threads", "Threads by status", labels=["status"])
        for status in Status:
            by_status.add_metric([status.value], counts.get(status, 0))
        yield by_status
        yield GaugeMetricFamily(
            "agentq_needs_attention",
            "Threads waiting for an operator",
            value=counts.get(Status.NEEDS_ATTENTION, 0),
        )
        lag = max(0.0, time.time() - oldest[0][1]) if oldest else 0.0
        yield GaugeMetricFamily(
            "agentq_due_lag_seconds",
            "How long the most overdue thread has waited past its due time",
            value=lag,
        )


class _ThisProcess(Collector):
    """The process's default registry (agentq's counters and whatever else the application
    registered there), read at scrape time. The store's collector is served beside it,
    never added to it: a worker started again in the process would report every thread
    twice, and the application's own exposition of that registry would reach the store."""

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        yield from REGISTRY.collect()


def registry(store: Store, *, counters: bool) -> CollectorRegistry:
    collected = CollectorRegistry(auto_describe=True)
    if counters and os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(collected)  # type: ignore[no-untyped-call]
    elif counters:
        collected.register(_ThisProcess())
    collected.register(StoreCollector(store))
    return collected


def serve(store: Store, port: int) -> Callable[[], None]:
    try:
        server, thread = _serve(port, registry=registry(store, counters=True))
    except OSError as exc:
        raise ConfigError(
            f"cannot serve metrics on port {port} ({exc.strerror or exc}): another process "
            "(a second worker on this machine?) may use it; give each worker a "
            "metrics_port of its own (agentq_metrics_port, or init_app(app, metrics_port=...))"
        ) from exc

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    return stop


def exposition(collected: CollectorRegistry) -> tuple[bytes, str]:
    return generate_latest(collected), CONTENT_TYPE_LATEST
