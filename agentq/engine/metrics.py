"""Prometheus metrics, when ``prometheus_client`` is installed: what workers did (counters
kept by each process) and what the store holds (read from its indexes at scrape time).

prometheus_client is imported, and agentq's counters registered in its default registry,
only when a process first records or serves metrics: a producer sending threads, or the
command line, pays neither. Without prometheus_client every hook returns at once.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from agentq.errors import ConfigError
from agentq.store.contract import Store

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

_lock = threading.RLock()
_available: list[bool] = []
"""Empty until first use, then whether prometheus_client could be imported."""

# A prefork worker's parent forks children while its sweeper may be loading the metrics or
# counting a recovery, and its metrics server reading the counters: a child forked then
# would inherit the lock held (this one, or prometheus_client's own on a counter, which it
# does not make anew after a fork), and its first step would wait on it for good. Every
# update and read of agentq's counters holds this lock, and the fork waits for it.
os.register_at_fork(
    before=_lock.acquire, after_in_parent=_lock.release, after_in_child=_lock.release
)


def _enabled() -> bool:
    if not _available:
        # Once per process: two threads committing their first steps at once would both
        # register the counters, and prometheus_client refuses a name registered twice.
        with _lock:
            if not _available:
                try:
                    from agentq.engine import prometheus
                except ImportError:  # the extra is not installed: metrics are off
                    _available.append(False)
                else:
                    prometheus.show_counters(_lock)
                    _available.append(True)
    return _available[0]


def committed(seconds: float) -> None:
    if _enabled():
        from agentq.engine import prometheus

        with _lock:
            prometheus.STEPS.inc()
            prometheus.COMMIT_SECONDS.observe(seconds)


def lease_lost() -> None:
    if _enabled():
        from agentq.engine import prometheus

        with _lock:
            prometheus.LEASES_LOST.inc()


def taken_over() -> None:
    if _enabled():
        from agentq.engine import prometheus

        with _lock:
            prometheus.TAKEOVERS.inc()


def recovered(count: int) -> None:
    if count and _enabled():
        from agentq.engine import prometheus

        with _lock:
            prometheus.RECOVERIES.inc(count)


def retried(exc: BaseException) -> None:
    if _enabled():
        from agentq.engine import prometheus

        with _lock:
            prometheus.RETRIES.labels(cause=type(exc).__name__).inc()


def _required() -> None:
    if not _enabled():
        raise ConfigError(
            "agentq metrics need prometheus_client: pip install 'agentq[prometheus]', or "
            "leave the metrics port unset"
        )


def registry(store: Store, *, counters: bool) -> CollectorRegistry:
    """What a scrape reads: the store's collector, and with ``counters`` this process's
    counters, or every process's under ``PROMETHEUS_MULTIPROC_DIR`` (a prefork worker's
    tasks run in its children)."""
    _required()
    from agentq.engine import prometheus

    return prometheus.registry(store, counters=counters)


def serve(store: Store, port: int) -> Callable[[], None]:
    """Serve the worker's metrics on ``port`` (all interfaces), from a thread; returns
    what stops serving and frees the port, for a worker started again in this process."""
    _required()
    from agentq.engine import prometheus

    return prometheus.serve(store, port)


def exposition(collected: CollectorRegistry) -> tuple[bytes, str]:
    """A scrape's body and content type."""
    from agentq.engine import prometheus

    return prometheus.exposition(collected)
