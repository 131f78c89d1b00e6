"""The threads' side of the store contract: opening, reading, forking, reopening, cancelling
and deleting threads, and their artifacts."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final

from agentq.errors import InvalidArgument, ThreadNotFound, ThreadStateError
from agentq.ids import validate_thread_id
from agentq.records import FINISHED, Listing, Schedule, Status, ThreadMeta
from agentq.store.contract.common import UNSET
from agentq.store.meta_fields import CANVAS

COLLECTABLE: Final = FINISHED | {Status.NEEDS_ATTENTION}
"""The statuses ``gc`` may delete: threads nothing drives or will drive by itself."""


def not_reopenable(
    thread_id: str, status: str, from_statuses: Collection[Status]
) -> ThreadStateError:
    """The refusal to reopen a thread in ``status``, outside ``from_statuses``."""
    return ThreadStateError(
        f"cannot reopen a thread in status {status!r} (only from "
        f"{sorted(Status(s).value for s in from_statuses)}); wait until it is one of those, "
        f"or fork it to start over from a checkpoint: 'agentq fork {thread_id} --from N' "
        "(store.fork in code)",
        thread_id=thread_id,
        status=status,
    )


class ThreadsContract(ABC):
    """The thread operations of :class:`~agentq.store.contract.Store`."""

    def open_thread(
        self,
        thread_id: str,
        *,
        task: str,
        node: str | None = None,
        input: Any = None,
        start_grace: float = 30.0,
        options: Mapping[str, Any] | None = None,
        origin: str | None = None,
        canvas: Mapping[str, Any] | None = None,
    ) -> tuple[ThreadMeta, bool]:
        """Create the thread as ``queued`` unless it exists; return its meta and whether it
        was created. A new thread is at ``node``, its task's entry node, until its first
        checkpoint names the next one. It is due ``start_grace`` seconds from now, so a lost
        message is re-sent by recovery, and keeps ``options`` (how to send it),
        ``origin`` (the id of the task sending it) and ``canvas`` (that task's callbacks,
        chain and chord) in its meta. An existing thread is returned unchanged.

        Atomic.
        """
        validate_thread_id(thread_id)
        if canvas is not None:  # stored with the options: see meta_fields.CANVAS
            options = {**(options or {}), CANVAS: canvas}
        return self._do_open_thread(
            thread_id,
            task=task,
            node=node,
            input=input,
            start_grace=start_grace,
            options=options,
            origin=origin,
        )

    @abstractmethod
    def _do_open_thread(
        self,
        thread_id: str,
        *,
        task: str,
        node: str | None,
        input: Any,
        start_grace: float,
        options: Mapping[str, Any] | None,
        origin: str | None,
    ) -> tuple[ThreadMeta, bool]: ...

    def meta(self, thread_id: str) -> ThreadMeta | None:
        """Return the thread's meta, or ``None`` if the store does not hold it. Atomic."""
        validate_thread_id(thread_id)
        return self._do_meta(thread_id)

    @abstractmethod
    def _do_meta(self, thread_id: str) -> ThreadMeta | None: ...

    @abstractmethod
    def threads(
        self, status: Status | None = None, *, limit: int = 100, offset: int = 0
    ) -> list[ThreadMeta]:
        """List threads, most recently updated first, optionally only those in ``status``.

        Not atomic across threads: each meta is read as it is at that moment.
        """

    @abstractmethod
    def status_counts(self) -> dict[Status, int]:
        """How many threads are in each status (every status present, zeros included),
        from the status indexes: no thread is read. Not atomic across statuses."""

    @abstractmethod
    def listing(
        self, status: Status | None = None, *, limit: int = 50, after: str | None = None
    ) -> Listing:
        """The status counts and a page of threads in the order of :meth:`threads`, each
        with only what a list shows (:class:`~agentq.records.ListedThread`), in one round
        trip (two on Redis Cluster). ``after`` is a row's ``cursor`` from an earlier page:
        the page goes on from there, so a thread that changes status meanwhile shifts no
        other, and a page deep in the list costs what the first does. Raises
        :class:`~agentq.errors.InvalidArgument` for a cursor this store did not give.
        Read-only, not atomic across threads."""

    def schedules(self, thread_ids: Sequence[str]) -> list[Schedule]:
        """The lease and due time of each thread, in the order given, in one round trip;
        an unknown thread gets an empty :class:`~agentq.records.Schedule`. Read-only, not
        atomic across threads."""
        for thread_id in thread_ids:
            validate_thread_id(thread_id)
        return self._do_schedules(thread_ids)

    @abstractmethod
    def _do_schedules(self, thread_ids: Sequence[str]) -> list[Schedule]: ...

    def delete_thread(self, thread_id: str) -> bool:
        """Delete the thread with every checkpoint, effect record and index entry it owns;
        ``False`` if it did not exist. Atomic. Global effect records are not the thread's
        and stay."""
        validate_thread_id(thread_id)
        return self._do_delete_thread(thread_id)

    @abstractmethod
    def _do_delete_thread(self, thread_id: str) -> bool: ...

    def fork(self, thread_id: str, step: int, new_thread_id: str) -> ThreadMeta:
        """Create ``new_thread_id`` holding a copy of checkpoint ``step`` of ``thread_id`` as
        its latest, with the source's task and input, in status ``waiting``, with no lease
        and no effect records. The fork gets copies of the append-only logs up to that
        checkpoint and of every artifact of the source, its own to read and to delete with
        it: deleting the source afterwards takes nothing the fork refers to. A thread holding
        LangGraph checkpoints (a graph task's) also gets copies of them, all namespaces,
        blobs and writes, owned and deleted as the rest.

        Raises :class:`~agentq.errors.CheckpointNotFound` if the step is not stored,
        :class:`~agentq.errors.FinalCheckpoint` if the thread finished at it (a fork would
        have nothing to run, and nothing would ever settle it),
        :class:`~agentq.errors.GraphStepMoved` if the thread holds LangGraph checkpoints and
        ``step`` is not where they stand (its latest step, with no worker driving it), and
        :class:`~agentq.errors.ThreadExists` if the new id is taken. Creating the new thread
        is atomic; the source is only read.
        """
        validate_thread_id(thread_id)
        validate_thread_id(new_thread_id)
        return self._do_fork(thread_id, step, new_thread_id)

    @abstractmethod
    def _do_fork(self, thread_id: str, step: int, new_thread_id: str) -> ThreadMeta: ...

    def reopen(
        self,
        thread_id: str,
        *,
        from_statuses: Collection[Status],
        resume_value: Any = UNSET,
        start_grace: float = 30.0,
    ) -> ThreadMeta:
        """Queue a thread again that nobody drives: if its status is in ``from_statuses``
        it becomes ``queued``, due in ``start_grace`` seconds, with its error, attempts,
        lost workers (``crashes``) and cancel flag cleared and ``resume_value`` stored when
        given (the next driver reads it from the meta); a ``waiting`` thread's timeout is
        dropped, so it never fires. The fence goes up: a write of the thread's last driver,
        sent again after its reply was lost, is refused rather than undo this.
        Raises :class:`~agentq.errors.ThreadStateError` for any other status and
        :class:`~agentq.errors.ThreadNotFound` for an unknown thread. Atomic.
        """
        validate_thread_id(thread_id)
        return self._do_reopen(
            thread_id,
            from_statuses=from_statuses,
            resume_value=resume_value,
            start_grace=start_grace,
        )

    @abstractmethod
    def _do_reopen(
        self,
        thread_id: str,
        *,
        from_statuses: Collection[Status],
        resume_value: Any,
        start_grace: float,
    ) -> ThreadMeta: ...

    def request_cancel(self, thread_id: str) -> Status:
        """Cancel the thread and return its status afterwards. A ``running`` thread under
        a live lease is flagged and its driver stops at the next step boundary; ``done``,
        ``failed`` and ``cancelled`` threads stay as they are; any other, a ``running`` one
        whose lease ran out included (no driver may be left to see a flag), becomes
        ``cancelled`` at once, leaves the due index and raises the fence, as :meth:`reopen`
        does. Raises :class:`~agentq.errors.ThreadNotFound`. Atomic."""
        validate_thread_id(thread_id)
        return self._do_request_cancel(thread_id)

    @abstractmethod
    def _do_request_cancel(self, thread_id: str) -> Status: ...

    def take_canvas(self, thread_id: str, taker: str) -> bool:
        """Whether ``taker`` (a Celery task id) carries the thread's canvas on: ``True``
        for the first caller, and for that caller asked again (a message redelivered, a
        reply lost); ``False`` for every other, and for a thread that does not exist.
        Atomic: of the tasks that find the thread ended, one runs its callbacks."""
        validate_thread_id(thread_id)
        return self._do_take_canvas(thread_id, taker)

    @abstractmethod
    def _do_take_canvas(self, thread_id: str, taker: str) -> bool: ...

    def put_artifact(self, thread_id: str, data: bytes) -> str:
        """Store ``data`` under its SHA-256 (hex, returned) in the thread's own keyspace;
        storing the same bytes twice keeps one copy. Deleted with the thread. Raises
        :class:`~agentq.errors.ThreadNotFound`, storing nothing, for a thread that does
        not exist: a node still running after its thread was deleted leaves no bytes that
        nothing owns. Atomic."""
        validate_thread_id(thread_id)
        digest = self._do_put_artifact(thread_id, data)
        if digest is None:
            raise ThreadNotFound(
                "cannot store an artifact: the thread does not exist (deleted by gc or "
                "delete_thread while its node ran?); nothing was stored",
                thread_id=thread_id,
            )
        return digest

    @abstractmethod
    def _do_put_artifact(self, thread_id: str, data: bytes) -> str | None:
        """The digest, or ``None`` when the thread does not exist."""

    def get_artifact(self, thread_id: str, digest: str) -> bytes:
        """Return an artifact's bytes; :class:`~agentq.errors.ArtifactNotFound` if absent."""
        validate_thread_id(thread_id)
        return self._do_get_artifact(thread_id, digest)

    @abstractmethod
    def _do_get_artifact(self, thread_id: str, digest: str) -> bytes: ...

    def gc(
        self,
        finished_ttl: float,
        statuses: Collection[Status] = FINISHED,
        *,
        limit: int | None = None,
    ) -> int:
        """Delete threads in ``statuses`` (by default the finished ones: ``done``,
        ``failed``, ``cancelled``) last updated more than ``finished_ttl`` seconds ago;
        return how many. With ``limit``, look at no more than that many, so that a caller
        with other work (the sweeper) gets back to it soon: fewer than ``limit`` removed
        means none is left, unless one was reopened meanwhile. Where the global indexes
        follow a thread in a second call (Redis Cluster), a call without ``limit`` also
        takes out every entry whose thread is gone, reading an entry per thread stored;
        a limited call reads the next share of them. Only threads nothing drives
        can be collected: ``statuses`` may also name ``needs_attention``, and anything
        else raises :class:`~agentq.errors.InvalidArgument`, as does a NaN
        ``finished_ttl`` (Redis cannot compare times with it, SQLite would quietly delete
        nothing). Each deletion is atomic and checks the status and the age again, so a
        thread reopened meanwhile stays."""
        if math.isnan(finished_ttl):
            raise InvalidArgument(
                "gc's finished_ttl is NaN; give the seconds since a thread finished, e.g. "
                "the finished_ttl setting (7 days by default), or inf to delete nothing"
            )
        chosen = frozenset(Status(s) for s in statuses)
        if not chosen <= COLLECTABLE:
            refused = sorted(s.value for s in chosen - COLLECTABLE)
            raise InvalidArgument(
                f"gc cannot delete threads in status {refused} (only "
                f"{sorted(s.value for s in COLLECTABLE)}): something may still drive them"
            )
        if limit is not None and limit < 1:
            raise InvalidArgument(f"gc's limit ({limit}) must be at least 1, or None for all")
        return self._do_gc(finished_ttl, chosen, limit)

    @abstractmethod
    def _do_gc(
        self, finished_ttl: float, statuses: frozenset[Status], limit: int | None
    ) -> int: ...
