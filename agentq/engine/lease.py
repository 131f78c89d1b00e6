"""Keeps the leases of every thread a process drives alive, however long their steps block.

One keeper per store per process renews all the leases it holds in one batch per beat
(:meth:`~agentq.store.contract.Store.renew_many`: one round trip, or one per Cluster
node), so a worker running a thousand threads has one renewing thread and one
connection at a time for it, not a thousand.

Timeline of a lease lost during a slow model call::

    t=0      worker A acquires (token 7), starts a 90 s model call; renewed at 10, 20 s
    t=25     A's process is paused (SIGSTOP, a long GC, a partition): no renewals
    t=50     the lease expires; recovery re-sends the thread
    t=51     worker B acquires: token 8, resumes from A's last checkpoint
    t=120    A wakes up: its renewal is refused (``lost`` is set), and its commit with
             token 7 is refused by the store. A stops at that boundary; B's work stands.

A batch that fails as a whole (the store is restarting) is tried again on the next beat;
a lease that has gone ``ttl`` without a successful renewal counts as lost. The concurrency
slots of limits taken by calls under a lease are renewed in the same beat, after it, so a
call longer than ``ttl`` keeps its slot while its worker lives and a dead worker's slots
expire with its leases.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from agentq.errors import LeaseLost
from agentq.store.contract import Renewal, Store
from agentq.store.contract.limits import Slot

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Lease:
    """One thread's lease as its driver holds it; ``lost`` is set once it is gone."""

    thread_id: str
    owner: str
    token: int
    ttl: float
    renewed_at: float = field(default_factory=time.monotonic)
    lost: threading.Event = field(default_factory=threading.Event)
    releasing: bool = False
    """Its driver is giving it up: a renewal refused from then on is no loss to report."""
    _slots: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """The limit keys whose concurrency slots each holder (a call in flight) has."""
    _slots_lock: threading.Lock = field(default_factory=threading.Lock)

    def remaining(self) -> float:
        """Seconds the lease is still ours for, as far as this process knows."""
        return self.ttl - (time.monotonic() - self.renewed_at)

    def hold_slots(self, holder: str, keys: tuple[str, ...]) -> None:
        """Renew ``holder``'s slots on ``keys`` with the lease until :meth:`drop_slots`."""
        with self._slots_lock:
            self._slots[holder] = keys

    def drop_slots(self, holder: str) -> None:
        with self._slots_lock:
            self._slots.pop(holder, None)

    def slots(self) -> list[Slot]:
        with self._slots_lock:
            held = list(self._slots.items())
        return [Slot(key, holder, self.ttl) for holder, keys in held for key in keys]


def confirm(store: Store, lease: Lease) -> None:
    """Renew ``lease`` right before an effect that must not happen once it is lost; raises
    :class:`~agentq.errors.LeaseLost` if it is lost.

    A renewal answered ``ttl`` or more after it was sent proves nothing about now: the
    process may have been frozen with the reply unread (SIGSTOP, a long GC pause) while the
    lease ran out and another worker took the thread over and made the call itself."""
    sent = time.monotonic()
    store.renew(lease.thread_id, lease.owner, lease.token, lease.ttl)
    took = time.monotonic() - sent
    if took >= lease.ttl:
        raise LeaseLost(
            f"renewing the lease with token {lease.token} took {took:.1f} s, not less than "
            f"lease_ttl ({lease.ttl:g} s), so another worker may drive the thread by now; "
            "stop driving this thread (raise lease_ttl if the store is this slow)",
            thread_id=lease.thread_id,
        )
    lease.renewed_at = sent


class LeaseKeeper:
    """Renews the leases held through :meth:`hold` every ``ttl / 3`` (the shortest held),
    on one daemon thread that runs while there is a lease to keep."""

    def __init__(self, store: Store) -> None:
        # Weakly: keeper_for's registry maps the store to its keeper, and a reference
        # back from the keeper would keep every store the process ever made alive. The
        # keeper's thread holds it while it runs, as the drivers of its leases do.
        self._store = weakref.ref(store)
        self._leases: set[Lease] = set()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._running = False
        self._beat_ttl = float("inf")
        """The shortest TTL the keeper's current wait was timed for."""

    @contextmanager
    def hold(self, thread_id: str, owner: str, token: int, ttl: float) -> Iterator[Lease]:
        """Keep the lease just acquired with ``token`` alive until the block ends."""
        lease = Lease(thread_id, owner, token, ttl)
        # Added inside the try: starting the keeper's thread yields to the hub under
        # gevent, where the greenlet may be killed (a terminate, a hard time limit); a
        # lease it left behind would be renewed for as long as the process lives.
        try:
            with self._lock:
                self._leases.add(lease)
                if self._running:
                    if ttl < self._beat_ttl:  # the next beat must come sooner
                        self._changed.notify()
                else:
                    self._running = True
                    keeper = threading.Thread(
                        target=self._keep,
                        args=(self._held_store(),),
                        name="agentq-lease-keeper",
                        daemon=True,
                    )
                    try:
                        keeper.start()
                    except BaseException:
                        # No thread (a pids limit, a kill while starting it): the next
                        # hold must start one, or no lease would be renewed again.
                        self._running = False
                        raise
            yield lease
        finally:
            with self._lock:
                self._leases.discard(lease)

    def _held_store(self) -> Store:
        store = self._store()
        assert store is not None  # the caller of hold() holds it
        return store

    def _keep(self, store: Store) -> None:
        beat = time.monotonic()
        while True:
            with self._lock:
                while True:
                    if not self._leases:
                        self._running = False
                        return
                    self._beat_ttl = min(lease.ttl for lease in self._leases)
                    due = beat + self._beat_ttl / 3
                    if due <= time.monotonic():
                        break
                    self._changed.wait(due - time.monotonic())
                leases = list(self._leases)
            beat = time.monotonic()
            self._renew(store, leases)

    def _renew(self, store: Store, leases: list[Lease]) -> None:
        started = time.monotonic()
        try:
            renewed = store.renew_many(
                [Renewal(lease.thread_id, lease.owner, lease.token, lease.ttl) for lease in leases]
            )
            # A reply that does not answer every lease is no answer: this thread, the only
            # keeper of the process's leases, must outlive it.
            answered = list(zip(leases, renewed, strict=True))
        except Exception as exc:
            if store.is_transient(exc):
                # Once a beat for as long as a restart or a failover lasts: a line each.
                logger.warning(
                    "renewing %d leases failed (%s: %s); trying again next beat",
                    len(leases),
                    type(exc).__name__,
                    exc,
                )
            else:
                logger.exception("renewing %d leases failed; trying again next beat", len(leases))
            for lease in leases:
                if lease.remaining() <= 0:
                    logger.warning("thread %s: lease ran out unrenewed", lease.thread_id)
                    self._lose(lease)
            return
        slots = []
        for lease, ok in answered:
            if ok:
                lease.renewed_at = started
                slots += lease.slots()
            else:
                if not lease.releasing:
                    logger.warning("thread %s: lease lost (token %d)", lease.thread_id, lease.token)
                self._lose(lease)
        if slots:
            try:
                store.renew_limits(slots)
            except Exception:
                # The next beat comes at a third of the TTL: two more tries before they expire.
                logger.exception(
                    "renewing %d limit slots failed; trying again next beat", len(slots)
                )

    def _lose(self, lease: Lease) -> None:
        lease.lost.set()
        with self._lock:
            self._leases.discard(lease)


_keepers: weakref.WeakKeyDictionary[Store, LeaseKeeper] = weakref.WeakKeyDictionary()
_keepers_lock = threading.Lock()


def keeper_for(store: Store) -> LeaseKeeper:
    """This process's keeper for ``store``, made on first use."""
    with _keepers_lock:
        keeper = _keepers.get(store)
        if keeper is None:
            keeper = _keepers[store] = LeaseKeeper(store)
        return keeper


def _forget_keepers() -> None:
    # A forked child inherits the parent's keepers but not their threads.
    global _keepers_lock
    _keepers.clear()
    _keepers_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_keepers)
