"""Store calls that outlast a passing store error: a pool timeout, a reset, a failover.

A driver's writes are safe to send again: a commit resent with the same checkpoint is
accepted as the one already written, a status is set to what it already is, and every
write carries the lease's fencing token, which a person's resume or cancel in between
raises, so a write sent again does not undo it. So a driver waits and tries again for as
long as its lease gives it, rather than leave the thread to recovery or fail it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any, TypeVar

from agentq.engine.backoff import backoff
from agentq.engine.lease import Lease
from agentq.errors import FencingError
from agentq.records import Status
from agentq.store.contract import Store

logger = logging.getLogger("agentq")

T = TypeVar("T")

_STORE_PACKAGE = "agentq.store."

FIRST_DELAY = 0.05
"""The first wait after a store error, in seconds; each next one may double."""


class RetriedCalls:
    """One driver's store calls, each tried again after a transient store error until
    the errors have gone on for ``lease_ttl`` or, once ``lease`` is set, the next wait
    would outlast it; then the last error is raised."""

    def __init__(self, store: Store, thread_id: str, lease_ttl: float) -> None:
        self.store = store
        self.thread_id = thread_id
        self.lease: Lease | None = None
        self.lease_ttl = lease_ttl

    def time_left(self) -> float:
        if self.lease is None:
            return math.inf
        if self.lease.releasing:
            # Given up by this driver's last writes, the keeper then finds it gone and
            # sets it lost: the writes after it (a cancel at the wait, leaving a
            # concurrency key) still wait an outage out for as long as it was renewed for.
            # Not longer: past that another worker may drive the thread.
            return max(0.0, self.lease.remaining())
        return 0.0 if self.lease.lost.is_set() else self.lease.remaining()

    def __call__(self, what: str, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``call(*args, **kwargs)``; ``what`` names it in the log ("committing")."""
        attempt, failing_since = 0, 0.0
        while True:
            try:
                return call(*args, **kwargs)
            except Exception as exc:
                if not self.store.is_transient(exc):
                    raise
                attempt += 1
                if attempt == 1:
                    failing_since = time.monotonic()
                # A store that renews the lease but refuses this one call would otherwise
                # be asked forever.
                outage_left = self.lease_ttl - (time.monotonic() - failing_since)
                remaining = min(self.time_left(), outage_left)
                delay = backoff(attempt, base=FIRST_DELAY, cap=max(remaining / 4, FIRST_DELAY))
                if delay >= remaining:
                    raise
                logger.warning(
                    "thread %s: store error on %s (%s: %s); try %d again in %.2f s",
                    self.thread_id,
                    what,
                    type(exc).__name__,
                    exc,
                    attempt + 1,
                    delay,
                )
                time.sleep(delay)


def raised_in_store(exc: BaseException) -> bool:
    """Whether ``exc`` came out of a call into agentq's store (one of its frames is in the
    traceback), rather than from a node's own client of the same library, whose
    ``ConnectionError`` is the node's failure and not an outage of the store."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__", "").startswith(_STORE_PACKAGE):
            return True
        tb = tb.tb_next
    return False


def give_back(store: Store, thread_id: str, token: int, owner: str) -> bool:
    """After the store failed for longer than the lease (a SQLite database another
    process kept locked, an outage): queue the thread, still running under ``token``,
    again if the store answers now, so that its next driver does not count the outage
    as a lost worker. A thread another worker took over meanwhile is left to it. Returns
    whether the store answered; if not, recovery resumes the thread once its lease runs
    out."""
    try:
        meta = store.meta(thread_id)
        if meta is not None and meta.status == Status.RUNNING and meta.fence == token:
            store.set_status(thread_id, token, Status.QUEUED, due_in=0, release_owner=owner)
    except FencingError:
        pass
    except Exception as exc:
        if not store.is_transient(exc):
            raise
        return False
    return True
