"""Store calls that outlast a passing store error: a pool timeout, a reset, a failover.

A driver's writes are safe to send again: a commit resent with the same checkpoint is
accepted as the one already written, a status is set to what it already is, and every
write carries the lease's fencing token. So a driver waits and tries again for as long
as its lease gives it, rather than leave the thread to recovery or fail it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from agentq.engine.backoff import backoff
from agentq.store.contract import Store

logger = logging.getLogger("agentq")

T = TypeVar("T")

FIRST_DELAY = 0.05
"""The first wait after a store error, in seconds; each next one may double."""


def with_store_retry(
    store: Store, thread_id: str, what: str, call: Callable[[], T], time_left: Callable[[], float]
) -> T:
    """``call()``, again after each transient store error until ``time_left()`` seconds
    (the lease's) would run out during the next wait; then the last error is raised."""
    attempt = 0
    while True:
        try:
            return call()
        except Exception as exc:
            if not store.is_transient(exc):
                raise
            attempt += 1
            remaining = time_left()
            delay = backoff(attempt, base=FIRST_DELAY, cap=max(remaining / 4, FIRST_DELAY))
            if delay >= remaining:
                raise
            logger.warning(
                "thread %s: store error on %s (%s: %s); try %d again in %.2f s",
                thread_id,
                what,
                type(exc).__name__,
                exc,
                attempt + 1,
                delay,
            )
            time.sleep(delay)
