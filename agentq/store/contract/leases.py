"""The lease side of the store contract: who drives a thread, with which fencing token, and
how recovery finds the threads nobody drives."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from agentq.errors import LeaseLost
from agentq.ids import validate_thread_id
from agentq.store.contract.common import Renewal, Taken, check_ttl

RESEND_SPACING_CAP = 16
"""A queued thread sent again and again is sent at most this many holds apart."""


class LeaseContract(ABC):
    """The lease and recovery operations of :class:`~agentq.store.contract.Store`."""

    def acquire(self, thread_id: str, owner: str, ttl: float) -> int:
        """Take the thread's lease for ``ttl`` seconds and return a new fencing token,
        greater than every token handed out for this thread before.

        An owner may re-acquire its own live lease (and gets a new token). A ``queued``,
        ``retrying`` or ``running`` thread becomes ``running`` and is due when the lease
        expires. So does a ``waiting`` thread whose wait's timeout passed: its ``interrupt``
        is copied for the next node (``timed_out`` in its meta) and a :meth:`reopen` after
        this is refused. Raises :class:`~agentq.errors.LeaseHeld` while another owner's
        lease is live, :class:`~agentq.errors.RetryNotDue` for a ``retrying`` thread before
        the time its ``set_status`` scheduled (a ``waiting`` one before its timeout), and
        :class:`~agentq.errors.ThreadNotFound` for an unknown thread. Atomic.
        """
        validate_thread_id(thread_id)
        check_ttl(thread_id, ttl)
        return self._do_acquire(thread_id, owner, ttl)

    @abstractmethod
    def _do_acquire(self, thread_id: str, owner: str, ttl: float) -> int: ...

    def acquire_to_run(self, thread_id: str, owner: str, ttl: float) -> Taken:
        """:meth:`acquire` for a driver about to run the thread, and its meta as the call
        left it, in one atomic call: what a driver reads before its first step. It leases
        the thread only if it runs by itself (``queued``, ``running``, ``retrying``, or
        ``waiting`` past its timeout); any other is returned unleased, its token ``None``,
        and nothing refuses it. A thread ``running`` under no live lease of ``owner`` lost
        its worker: ``crashes`` counts it, and ``lost_worker`` says so (a call asked again
        after a lost reply finds the lease of the call that counted it, and says so again
        without counting it twice). Else raises what :meth:`acquire` raises."""
        validate_thread_id(thread_id)
        check_ttl(thread_id, ttl)
        return self._do_acquire_to_run(thread_id, owner, ttl)

    @abstractmethod
    def _do_acquire_to_run(self, thread_id: str, owner: str, ttl: float) -> Taken: ...

    def renew(self, thread_id: str, owner: str, token: int, ttl: float) -> None:
        """Extend the lease to ``ttl`` seconds from now and push the thread's due time with
        it. Raises :class:`~agentq.errors.LeaseLost` if the lease expired or changed hands.
        Atomic."""
        validate_thread_id(thread_id)
        check_ttl(thread_id, ttl)
        self._do_renew(thread_id, owner, token, ttl)

    @abstractmethod
    def _do_renew(self, thread_id: str, owner: str, token: int, ttl: float) -> None: ...

    def renew_many(self, leases: Sequence[Renewal]) -> list[bool]:
        """:meth:`renew` every lease in ``leases`` at once: ``True`` where it was renewed,
        ``False`` where it was lost. An error of the store itself raises, and then any of
        them may or may not have been renewed."""
        for lease in leases:
            validate_thread_id(lease.thread_id)
            check_ttl(lease.thread_id, lease.ttl)
        return self._do_renew_many(leases)

    def _do_renew_many(self, leases: Sequence[Renewal]) -> list[bool]:
        """One call per lease; a backend that can batch them overrides this."""
        renewed = []
        for lease in leases:
            try:
                self._do_renew(*lease)
            except LeaseLost:
                renewed.append(False)
            else:
                renewed.append(True)
        return renewed

    def release(self, thread_id: str, owner: str, token: int) -> bool:
        """Give the lease up; ``False`` if it was no longer ours (nothing changes). Atomic."""
        validate_thread_id(thread_id)
        return self._do_release(thread_id, owner, token)

    @abstractmethod
    def _do_release(self, thread_id: str, owner: str, token: int) -> bool: ...

    # -- recovery ------------------------------------------------------------------------

    @abstractmethod
    def due(self, *, limit: int = 100) -> list[tuple[str, float]]:
        """Return ``(thread_id, due_at)`` for threads due now, earliest first. Read-only."""

    @abstractmethod
    def claim_due(self, *, hold: float, limit: int = 100) -> list[str]:
        """Return the threads due now and push each one's due time ``hold`` seconds ahead,
        so a concurrent sweeper does not send it again before the thread has had time to
        start. Atomic."""

    def unclaim_due(self, thread_ids: Sequence[str]) -> None:
        """Make due now the threads :meth:`claim_due` returned whose message the sweeper
        did not send (the store or the broker failed before it got to them), so that the
        next sweep sends them rather than one a ``hold`` later. Only brings a due time
        forward: a thread that left the index since stays out. Atomic."""
        for thread_id in thread_ids:
            validate_thread_id(thread_id)
        if thread_ids:
            self._do_unclaim_due(thread_ids)

    @abstractmethod
    def _do_unclaim_due(self, thread_ids: Sequence[str]) -> None: ...

    def defer_due(self, thread_id: str, fence: int, hold: float) -> None:
        """Space out the sends of a ``queued`` thread the sweeper has just sent again and
        no worker took since (its fencing token is still ``fence``): queued for more than
        two ``hold``s by the store's clock, its messages most likely wait in a backlog,
        and it becomes due after as long as it has been queued, up to
        :data:`RESEND_SPACING_CAP` ``hold``s, rather than a ``hold`` from now. Changes
        nothing otherwise. Atomic."""
        validate_thread_id(thread_id)
        self._do_defer_due(thread_id, fence, hold)

    @abstractmethod
    def _do_defer_due(self, thread_id: str, fence: int, hold: float) -> None: ...

    def sync_index(self, thread_id: str) -> None:
        """Set the thread's entries in the global indexes (its status, its due time) from
        its meta, or remove them if the thread does not exist. The sweeper calls it for a
        thread it found due but not to be run. Nothing to do where the indexes change with
        the thread in one transaction (the default); on Redis Cluster they follow in a
        second call, which a lost reply or a crashed client can leave unsent."""
        validate_thread_id(thread_id)

    def lease_sweeper(self, owner: str, ttl: float) -> bool:
        """Take or extend the sweeper's lease for ``ttl`` seconds; ``False`` while another
        owner holds it. Lets one of many workers sweep at a time. Atomic."""
        check_ttl("sweeper", ttl)
        return self._do_lease_sweeper(owner, ttl)

    @abstractmethod
    def _do_lease_sweeper(self, owner: str, ttl: float) -> bool: ...
