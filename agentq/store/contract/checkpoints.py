"""The checkpoints' side of the store contract: the fenced commit, status changes, and the
reads of a thread's chain of checkpoints."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from agentq.ids import validate_thread_id
from agentq.records import Checkpoint, Status
from agentq.store.contract.common import UNSET, _Unset


class CheckpointsContract(ABC):
    """The checkpoint operations of :class:`~agentq.store.contract.Store`."""

    def commit(
        self,
        thread_id: str,
        token: int,
        checkpoint: Checkpoint,
        *,
        status: Status = Status.RUNNING,
        due_in: float | _Unset | None = None,
        result: Any = UNSET,
        interrupt: Any = UNSET,
        release_owner: str | None = None,
        logs: Mapping[str, int] | None = None,
    ) -> bool:
        """Write checkpoint ``checkpoint.step`` as the thread's latest; return whether a
        cancellation was requested meanwhile (see :meth:`request_cancel`), so the driver
        learns it without another round trip.

        Succeeds only if ``token`` is the thread's current fencing token (else
        :class:`~agentq.errors.StaleToken`) and the latest step is ``checkpoint.step - 1``
        (else :class:`~agentq.errors.StepConflict`). In one atomic operation it writes the
        snapshot, the latest pointer, the meta (status, step, node; attempts and crashes
        reset to 0; a consumed resume value or timed-out wait, and the error of an earlier
        attempt, removed;
        ``result`` and the ``interrupt`` payload stored if given, else no interrupt), the
        status and due indexes (due in
        ``due_in`` seconds, out of the due index when ``None``, as it was when ``UNSET``:
        a running thread's due time follows its lease; a ``waiting`` thread's is the
        timeout of its wait, see :meth:`set_status`), and prunes checkpoints
        beyond ``keep_last``; with ``release_owner`` it also releases that owner's lease.
        On any refusal no key changes. Encoding errors are raised before anything is written.

        ``logs`` declares append-only state fields: it maps each to the number of its items
        already stored (the length at the previous checkpoint). Only the items after those
        are written, to the field's log, in the same atomic operation; the snapshot records
        the field's length, and loading any checkpoint rebuilds the field from its log. A
        log that does not hold exactly that many items refuses the commit with
        :class:`~agentq.errors.LogConflict`. Fork and delete cover the logs.
        """
        validate_thread_id(thread_id)
        return self._do_commit(
            thread_id,
            token,
            checkpoint,
            status=status,
            due_in=due_in,
            result=result,
            interrupt=interrupt,
            release_owner=release_owner,
            logs=logs,
        )

    @abstractmethod
    def _do_commit(
        self,
        thread_id: str,
        token: int,
        checkpoint: Checkpoint,
        *,
        status: Status,
        due_in: float | _Unset | None,
        result: Any,
        interrupt: Any,
        release_owner: str | None,
        logs: Mapping[str, int] | None,
    ) -> bool: ...

    def set_status(
        self,
        thread_id: str,
        token: int,
        status: Status,
        *,
        due_in: float | None = None,
        error: str | _Unset | None = UNSET,
        attempts: int | _Unset = UNSET,
        crashes: int | _Unset = UNSET,
        result: Any = UNSET,
        interrupt: Any = UNSET,
        release_owner: str | None = None,
        raise_fence: bool = False,
    ) -> None:
        """Change the thread's status without a new checkpoint (a retry being scheduled, a
        failure, an interrupt), fenced by ``token`` like ``commit``. Meta values left
        ``UNSET`` stay as they are. A thread set ``retrying`` with ``due_in`` cannot be
        acquired before then. A thread set ``waiting`` with ``due_in`` waits with that
        timeout (``timeout``, ``timeout_at`` in its meta): :meth:`acquire` refuses it
        before then and takes it out of the wait after; without ``due_in`` it waits until
        reopened. A thread asked to cancel (:meth:`request_cancel`) is set ``cancelled``
        instead of ``waiting``, here and by :meth:`commit`: the wait is the step boundary
        the cancel stops it at, and a resume (which clears the request) must never find it
        waiting. ``raise_fence`` refuses every later write under ``token``: for a run
        stopped from outside, whose process may still write before it dies. Atomic."""
        validate_thread_id(thread_id)
        self._do_set_status(
            thread_id,
            token,
            status,
            due_in=due_in,
            error=error,
            attempts=attempts,
            crashes=crashes,
            result=result,
            interrupt=interrupt,
            release_owner=release_owner,
            raise_fence=raise_fence,
        )

    @abstractmethod
    def _do_set_status(
        self,
        thread_id: str,
        token: int,
        status: Status,
        *,
        due_in: float | None,
        error: str | _Unset | None,
        attempts: int | _Unset,
        crashes: int | _Unset,
        result: Any,
        interrupt: Any,
        release_owner: str | None,
        raise_fence: bool,
    ) -> None: ...

    def latest(self, thread_id: str) -> Checkpoint | None:
        """Return the latest checkpoint, ``None`` if none was committed. One round trip
        (on Redis, two when another process committed since this store last saw the
        thread)."""
        validate_thread_id(thread_id)
        return self._do_latest(thread_id)

    @abstractmethod
    def _do_latest(self, thread_id: str) -> Checkpoint | None: ...

    def checkpoint(self, thread_id: str, step: int) -> Checkpoint:
        """Return checkpoint ``step``; :class:`~agentq.errors.CheckpointNotFound` if it was
        never written or was pruned."""
        validate_thread_id(thread_id)
        return self._do_checkpoint(thread_id, step)

    @abstractmethod
    def _do_checkpoint(self, thread_id: str, step: int) -> Checkpoint: ...

    def history(
        self, thread_id: str, *, before: int | None = None, limit: int = 20
    ) -> list[Checkpoint]:
        """Return up to ``limit`` checkpoints, newest first, with steps below ``before`` when
        given (pass the last step of a page to get the next one)."""
        validate_thread_id(thread_id)
        return self._do_history(thread_id, before=before, limit=limit)

    @abstractmethod
    def _do_history(
        self, thread_id: str, *, before: int | None, limit: int
    ) -> list[Checkpoint]: ...
