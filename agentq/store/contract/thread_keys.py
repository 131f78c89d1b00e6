"""The concurrency-key side of the store contract: at most N threads of a key run at once,
the others wait in arrival order in the store, not in a worker's pool.

A thread holds a slot of its key from the moment its driver enters the key until its task
leaves the thread (finished, failed, waiting, retrying, handed over, cancelled). The slot
belongs to the lease token the driver entered with, and lives only as long as that lease:
a worker killed while holding one gives it back when its lease expires, and the next
sweep wakes the thread waiting first. A thread that finds its key full is *parked*:
``queued``, out of the due index (nothing polls it), and in the key's queue, until a slot
frees up and the thread freeing it (or the sweeper) wakes it: the woken thread leaves the
queue holding a reserved slot, is due again, and is sent.

Timeline of a wake, and why the slot is reserved rather than free::

    A (running, 1 of 1)      B (parked, first)      C (new)
    leave_key: A's slot goes, B leaves the queue with the slot reserved, B is due
                             B's message is sent    C enters: the key is full, C parks
                             B enters: its reserved slot becomes its own

Without the reservation C could take the slot between B's wake and B's start, and B would
park again behind C: arrival order would be lost.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Final, NamedTuple

from agentq.errors import LimitError
from agentq.ids import validate_thread_id

CANCEL_REQUESTED: Final = -1
"""What :meth:`ThreadKeysContract.enter_key` returns for a thread whose cancel was asked
for after its driver took the lease (``cancel()`` only flags a running thread): it is
neither given a slot nor parked, and its driver cancels it before its first step."""


class KeyWaiter(NamedTuple):
    """A thread parked on a concurrency key."""

    thread_id: str
    position: int
    """1 for the thread that starts next."""
    since: float
    """When it was parked, a Unix time on the store's clock."""


class KeyState(NamedTuple):
    """What the store holds of one concurrency key. Read-only, on the store's clock."""

    key: str
    cap: int
    """The cap the last thread entering the key gave, or leaving it with a cap."""
    running: list[str]
    """The threads holding a live slot (or one reserved for them, woken and not started)."""
    waiting: list[KeyWaiter]
    """The parked threads, first to start first."""


def _check_cap(thread_id: str, key: str, cap: int) -> None:
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise LimitError(
            f"thread {thread_id}: concurrency key {key!r} needs a cap of at least 1 thread, "
            f"got {cap!r}; set threads=N on its agentq.limit(...)"
        )


class ThreadKeysContract(ABC):
    """The concurrency-key operations of :class:`~agentq.store.contract.Store`."""

    def enter_key(self, thread_id: str, owner: str, token: int, key: str, cap: int) -> int:
        """Give the thread a slot of ``key``, which at most ``cap`` threads hold at once,
        owned by its lease (``owner``, ``token``); return 0. A thread holding a slot (even
        one its previous lease held, or one reserved for it) keeps it. A free slot goes to
        a newcomer only while nobody waits, or to a waiter among the first as many as
        slots are free. Otherwise the thread is parked and its position (1-based) is
        returned: it becomes ``queued`` without a due time, its lease is released, and it
        joins the end of the key's queue (or keeps its place there). Slots whose lease
        expired are reclaimed first. A thread whose cancel was asked for is left as it is
        and :data:`CANCEL_REQUESTED` returned: parked, it would wait for a turn it must
        not take. Raises :class:`~agentq.errors.StaleToken` for a
        token that is not the thread's latest, and
        :class:`~agentq.errors.ThreadStateError` unless the thread is ``running`` (one
        that stopped, e.g. was cancelled, is never queued again). Atomic."""
        validate_thread_id(thread_id)
        _check_cap(thread_id, key, cap)
        return self._do_enter_key(thread_id, owner, token, key, cap)

    @abstractmethod
    def _do_enter_key(self, thread_id: str, owner: str, token: int, key: str, cap: int) -> int: ...

    def leave_key(
        self, thread_id: str, token: int, key: str, *, start_grace: float, cap: int | None = None
    ) -> list[str]:
        """Give back the thread's slot of ``key`` if ``token`` still owns it, then wake as
        many waiters as slots are free, first come first: each leaves the queue with a
        slot reserved for it and is due in ``start_grace`` seconds (so recovery sends it
        if the caller does not). ``cap``, the key's cap as declared now, becomes the
        key's cap first; without one the cap the last thread entering gave stands.
        Returns the woken threads, for the caller to send. Atomic."""
        validate_thread_id(thread_id)
        if cap is not None:
            _check_cap(thread_id, key, cap)
        return self._do_leave_key(thread_id, token, key, start_grace, cap)

    @abstractmethod
    def _do_leave_key(
        self, thread_id: str, token: int, key: str, start_grace: float, cap: int | None
    ) -> list[str]: ...

    @abstractmethod
    def wake_keys(self) -> list[str]:
        """For every key with waiters: reclaim the slots whose lease expired (a killed
        worker's) or whose thread stopped before it started, and wake as many waiters as
        slots are free, due now, for the sweeper's next ``claim_due`` to send. Returns the
        woken threads. Atomic per key."""

    @abstractmethod
    def key_states(self) -> list[KeyState]:
        """Every concurrency key with a thread running or waiting, sorted by key. A slot
        whose lease expired and is not reclaimed yet is not listed. Read-only."""
