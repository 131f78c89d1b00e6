"""The graph store contract: what LangGraph's saver needs from an agentq store, in bytes.

Each store gives its implementation with :meth:`~agentq.store.contract.Store.graph`.

Every write carries the writer's fencing token, or ``None`` for a writer outside a graph
task. In the same atomic step as the write, the graph store reads the thread's agentq meta:

- with a token, the write is refused with :class:`~agentq.errors.StaleToken` unless it is
  the thread's current fence (another worker has taken the thread over since), and with
  :class:`~agentq.errors.ThreadNotFound` if agentq holds no such thread;
- without one, it is refused with :class:`~agentq.errors.LeaseHeld` while a graph task
  holds the thread's lease (someone calling ``update_state`` on a running thread would
  fork its checkpoint chain), and allowed otherwise.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence

from agentq.errors import LeaseHeld, StaleToken, ThreadNotFound
from agentq.store.graph_records import Row, StoredCheckpoint


class GraphStore(ABC):
    """LangGraph checkpoints, blobs and writes kept beside an agentq store's threads."""

    @abstractmethod
    def put(self, thread_id: str, ns: str, stored: StoredCheckpoint, token: int | None) -> None:
        """Store the checkpoint and its new blobs, and with ``stored.clears_failures``
        clear the thread's failed attempts and lost workers. Atomic."""

    @abstractmethod
    def put_writes(
        self,
        thread_id: str,
        ns: str,
        checkpoint_id: str,
        writes: Sequence[tuple[bytes, bytes, bool]],
        token: int | None,
        run_id: str | None,
    ) -> None:
        """Store ``(field, value, replace)`` writes; without ``replace`` an existing write
        with the same field is kept (LangGraph's regular writes are first-wins, its special
        ones last-wins). The writes stored are ``run_id``'s, for :meth:`delete_runs`.
        Atomic."""

    @abstractmethod
    def get(
        self,
        thread_id: str,
        ns: str,
        checkpoint_id: str | None,
        channels: Collection[str] | None = None,
    ) -> Row | None:
        """The checkpoint with that id, or the namespace's latest. One round trip. With
        ``channels``, only their blobs are read (and ``fields`` lists only theirs)."""

    @abstractmethod
    def page(self, thread_id: str, ns: str, *, before: str | None, limit: int) -> list[Row]:
        """Up to ``limit`` checkpoints of the namespace, newest first, with ids below
        ``before`` when given."""

    @abstractmethod
    def namespaces(self, thread_id: str) -> list[str]:
        """The namespaces holding checkpoints of the thread."""

    @abstractmethod
    def threads(self) -> list[str]:
        """Every thread holding LangGraph checkpoints (may list some that no longer do)."""

    @abstractmethod
    def delete_thread(self, thread_id: str, token: int | None) -> None:
        """Remove every checkpoint, blob and write of the thread. Atomic."""

    @abstractmethod
    def delete_runs(self, run_ids: Sequence[str]) -> None:
        """Remove the checkpoints (and their writes) written by these runs, the writes
        they made to other checkpoints (a run resuming a thread writes to the checkpoint
        it resumes from), and the blobs no remaining checkpoint reads. Atomic per
        thread."""

    @abstractmethod
    def keep_latest(self, thread_id: str, keep: Mapping[str, Collection[str]]) -> None:
        """Keep only the latest checkpoint of each namespace and the ones ``keep`` names
        for it (with their writes and the blobs they read). Atomic."""

    @abstractmethod
    def copy_thread(self, source: str, target: str) -> None:
        """Copy every checkpoint, blob and write of ``source`` into ``target``. Writing the
        target is atomic; the source is only read."""


def stale_token(thread_id: str, token: int, fence: int) -> StaleToken:
    return StaleToken(
        f"LangGraph write with fencing token {token} refused: the thread's current token "
        f"is {fence}, so another worker has taken the thread over; stop this run",
        thread_id=thread_id,
    )


def thread_not_found(thread_id: str) -> ThreadNotFound:
    return ThreadNotFound(
        "a fenced LangGraph write names a thread agentq does not hold; start the thread "
        "through its graph task, or write without a token",
        thread_id=thread_id,
    )


def lease_held(thread_id: str, ttl_ms: int) -> LeaseHeld:
    return LeaseHeld(
        f"a graph task drives this thread (lease for {ttl_ms} ms more), so a write "
        "from outside it would fork the checkpoint chain; wait until the thread is "
        "waiting or finished, or cancel it first",
        thread_id=thread_id,
        ttl_ms=ttl_ms,
    )
