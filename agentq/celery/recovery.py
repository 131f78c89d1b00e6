"""Recovery: re-sends every thread the store says is due, whatever the broker did."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import kombu.exceptions

from agentq.celery.runtime import runtime_of
from agentq.celery.store_guard import recheck_store
from agentq.celery.task import resend_thread
from agentq.engine import metrics
from agentq.ids import owner_id
from agentq.records import Status
from agentq.store.contract import Store

logger = logging.getLogger("agentq.celery.recovery")

GC_INTERVAL = 60.0
CLAIM_BATCH = 500
"""Due threads claimed in one store call."""
GC_BATCH = 100
"""Finished threads one sweep deletes at most (tens of milliseconds): a backlog of them
is worked off a batch a sweep, never holding up the sends of due threads behind it."""
STORE_CHECK_INTERVAL = 30.0
"""Seconds between two looks at the store's settings in every worker, leader or not."""


class Sweeper:
    """Reads the due-time index and sends a message for each due thread.

    A thread is due when its lease expired (its worker died or froze), its retry timer
    ran out, its wait for a human timed out, or it was queued and never started (the
    message was lost). ``claim_due``
    pushes each entry ahead atomically before the message is sent, so sweepers in several
    workers never send the same entry twice; a duplicate that slips through anyway (a
    broker redelivery) is absorbed by the thread's lease.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.owner = owner_id()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gc_at = 0.0
        self._check_at = time.monotonic() + STORE_CHECK_INTERVAL  # checked at start

    def sweep_once(self) -> list[str]:
        """Send every due thread once; return their ids."""
        runtime = runtime_of(self.app)
        store, settings = runtime.store, runtime.settings
        # Slots a killed worker held die with its lease: their waiters become due now,
        # and the claims below send them.
        self._wake_keys(store)
        sent = self._send_due(store, settings.start_grace)
        metrics.recovered(len(sent))
        if time.monotonic() >= self._gc_at:
            self._gc_at = time.monotonic() + GC_INTERVAL
            removed = store.gc(settings.finished_ttl, limit=GC_BATCH)
            if removed:
                logger.info("removed %d finished threads past their TTL", removed)
            if removed == GC_BATCH:  # maybe more: the next sweep goes on
                self._gc_at = time.monotonic()
        return sent

    def _wake_keys(self, store: Store) -> None:
        try:
            woken = store.wake_keys()
        except Exception as exc:
            if store.is_transient(exc):
                raise  # the claims after it could not go through either
            # One bad key (a key of another type under the prefix) must not stop the
            # sends of every due thread behind it.
            logger.exception("waking concurrency keys failed; due threads are still sent")
            return
        if woken:
            logger.info("concurrency keys freed by expired leases wake %s", woken)

    def _send_due(self, store: Store, hold: float) -> list[str]:
        """Claim and send the due threads, batch after batch until one comes back short:
        a worker process running a thousand threads leaves them all due at once, and each
        must go out now, not a batch a sweep. A thread claimed once is held off for
        ``hold``, but sending the batches may take longer than that (a slow broker, a
        short grace): a thread claimed again in the same sweep was sent already, and ends
        it, or every full batch would send the same threads again, without end."""
        sent: list[str] = []
        done: set[str] = set()
        while True:
            claimed = store.claim_due(hold=hold, limit=CLAIM_BATCH)
            again = False
            for at, thread_id in enumerate(claimed):
                if thread_id in done:
                    again = True  # its message is on its way: the claim held it off again
                    continue
                try:
                    resent = self._send(thread_id, hold)
                except Exception:
                    self._unclaim([t for t in claimed[at + 1 :] if t not in done])
                    raise
                done.add(thread_id)
                if resent:
                    sent.append(thread_id)
            if again or len(claimed) < CLAIM_BATCH or self._stop.is_set():
                return sent  # a stopping worker leaves the rest to the other sweepers

    def _send(self, thread_id: str, hold: float) -> bool:
        """Send a message for the claimed thread if it still runs by itself; return
        whether one was sent (the sweep reports only those, as ``agentq sweep`` prints)."""
        store = runtime_of(self.app).store
        meta = store.meta(thread_id)
        if meta is None or not meta.runs_by_itself:
            # Due by an index entry its last change left behind (on Redis Cluster, a
            # lost second call): put the entries right, or it comes back every sweep.
            store.sync_index(thread_id)
            return False
        resend_thread(self.app, meta)
        logger.info("thread %s (%s, step %d) re-sent", thread_id, meta.status.value, meta.step)
        if meta.status == Status.QUEUED and time.time() - meta.updated_at > 1.5 * hold:
            # Queued that long, it was sent before and no worker took it: its messages
            # most likely wait in a backlog, where one more every hold would pile up (a
            # hundred each in an hour's backlog). The store spaces its sends out past two
            # holds by its own clock; asked past one and a half by this one, a first send
            # (a hold after the thread was queued) costs no round trip more.
            try:
                store.defer_due(thread_id, meta.fence, hold)
            except Exception as exc:  # it is only sent again after a hold, as before
                logger.warning("thread %s: its next send is not deferred (%s)", thread_id, exc)
        return True

    def _unclaim(self, unsent: list[str]) -> None:
        """Make the claimed threads a failed send or read kept this sweep from due again,
        so that the next sweep sends them rather than one a start grace later. The thread
        that failed is not among them: one whose send always fails (its stored options
        refused by the broker) must not stop the sweep before every other due thread."""
        if not unsent:
            return
        try:
            runtime_of(self.app).store.unclaim_due(unsent)
        except Exception as exc:
            # The store is down too: they come back when the claim's hold runs out.
            logger.warning(
                "%d threads claimed but not sent are due again in a start grace (%s: %s)",
                len(unsent),
                type(exc).__name__,
                exc,
            )

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="agentq-sweeper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def sweep_if_leader(self) -> list[str]:
        """Sweep if this sweeper holds (or takes) the sweeper lease; many workers run a
        sweeper, one sweeps at a time, and another takes over within a few intervals if
        it dies."""
        interval = runtime_of(self.app).settings.sweep_interval
        if not runtime_of(self.app).store.lease_sweeper(self.owner, max(3 * interval, 1.0)):
            return []
        return self.sweep_once()

    def recheck_store_if_due(self) -> None:
        """Look at the store's settings again once :data:`STORE_CHECK_INTERVAL` passed."""
        if time.monotonic() < self._check_at:
            return
        self._check_at = time.monotonic() + STORE_CHECK_INTERVAL
        runtime = runtime_of(self.app)
        recheck_store(runtime.store, runtime.settings)

    def _loop(self) -> None:
        interval = runtime_of(self.app).settings.sweep_interval
        while not self._stop.wait(interval):
            try:
                self.recheck_store_if_due()
                self.sweep_if_leader()
            except Exception as exc:
                # A broker restarting fails each send as the store's restart fails each
                # claim (kombu gives up on a publish with OperationalError).
                if runtime_of(self.app).store.is_transient(exc) or isinstance(
                    exc, kombu.exceptions.OperationalError
                ):
                    # Every interval for as long as a restart or a failover lasts: a line each.
                    logger.warning(
                        "sweep failed (%s: %s); trying again in %.1f s",
                        type(exc).__name__,
                        exc,
                        interval,
                    )
                else:
                    logger.exception("sweep failed; trying again in %.1f s", interval)
