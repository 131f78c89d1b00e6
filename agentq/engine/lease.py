"""Keeps a thread's lease alive while a step runs, however long it blocks."""

from __future__ import annotations

import logging
import threading
import time
from types import TracebackType

from agentq.errors import LeaseLost
from agentq.store.contract import Store

logger = logging.getLogger(__name__)


class Heartbeat:
    """Renews the lease every ``ttl / 3`` seconds on a daemon thread.

    Timeline of a lease lost during a slow model call::

        t=0      worker A acquires (token 7), starts a 90 s model call; renews at 10, 20 s
        t=25     A's process is paused (SIGSTOP, a long GC, a partition): no renewals
        t=50     the lease expires; recovery re-sends the thread
        t=51     worker B acquires: token 8, resumes from A's last checkpoint
        t=120    A wakes up: its renewal fails (``lost`` is set), and its commit with token
                 7 is refused by the store. A stops at that boundary; B's work stands.

    A renewal that fails for another reason (the store is restarting) is retried on the
    next beat; once ``ttl`` has passed without a successful one, the lease counts as lost.
    """

    def __init__(self, store: Store, thread_id: str, owner: str, token: int, ttl: float):
        self.store = store
        self.thread_id = thread_id
        self.owner = owner
        self.token = token
        self.ttl = ttl
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, name=f"agentq-heartbeat-{thread_id}", daemon=True
        )

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        renewed_at = time.monotonic()
        while not self._stop.wait(self.ttl / 3):
            try:
                self.store.renew(self.thread_id, self.owner, self.token, self.ttl)
                renewed_at = time.monotonic()
            except LeaseLost:
                logger.warning("thread %s: lease lost (token %d)", self.thread_id, self.token)
                self.lost.set()
                return
            except Exception:
                logger.exception("thread %s: lease renewal failed", self.thread_id)
                if time.monotonic() - renewed_at > self.ttl:
                    self.lost.set()
                    return
