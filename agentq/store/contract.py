"""The store contract: what every agentq backend provides, and how atomic each call is.

A store holds threads. A thread has meta (status, step, node, ...), an append-only chain of
checkpoints addressed by step, a lease with a fencing token, idempotency records for its
side effects, and an entry in the due-time index while something should run it.

Fencing: ``acquire`` hands out a token that only ever increases for a thread. Every write a
driver makes (``commit``, ``set_status``, ``claim_effect``, ``complete_effect``) carries it,
and the store refuses the write with :class:`~agentq.errors.StaleToken` once a newer token
exists. A worker that was paused past its lease ("zombie") therefore cannot damage the
thread, whatever it believes.

Times: durations are seconds (floats); the due index and timestamps are Unix times taken
from the store's clock where it has one (Redis ``TIME``), so workers' clocks may drift.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final, NamedTuple, Self

from agentq.errors import InvalidArgument, LeaseLost, RetryNotDue
from agentq.ids import validate_effect_key, validate_thread_id
from agentq.records import Checkpoint, Claim, Effect, Finding, Status, ThreadMeta
from agentq.settings import DEFAULT_KEEP_LAST, DEFAULT_MAX_CHECKPOINT_BYTES
from agentq.store.graph import GraphStore


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = _Unset()
"""Marks an optional meta value the caller leaves as it is (``None`` is a value)."""


class Renewal(NamedTuple):
    """One lease to extend in :meth:`Store.renew_many`."""

    thread_id: str
    owner: str
    token: int
    ttl: float


class Store(ABC):
    """A durable home for threads. Subclasses: ``RedisStore``, ``SQLiteStore``.

    Each public method checks its arguments (thread ids, effect keys, lease TTLs) here,
    once, then calls the backend's ``_do_<name>`` with the same arguments: a backend never
    sees an id it could not store, and every backend refuses bad input in the same words.
    """

    keep_last: int
    """How many checkpoints of a thread are kept; older ones are deleted by ``commit``."""
    max_checkpoint_bytes: int
    """The encoded size over which ``commit`` refuses a checkpoint."""
    transient_errors: tuple[type[BaseException], ...] = ()
    """Errors that mean the store could not be reached (a restart, a timeout): nothing was
    decided, so a driver that meets one tries again while its lease lasts instead of
    failing the thread."""

    def is_transient(self, exc: BaseException) -> bool:
        """Whether ``exc`` says the store could not answer now but may soon (see
        :attr:`transient_errors`; a backend adds refusals it knows to be passing)."""
        return isinstance(exc, self.transient_errors)

    def __init__(
        self,
        *,
        keep_last: int = DEFAULT_KEEP_LAST,
        max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
    ) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, got {keep_last}")
        if max_checkpoint_bytes < 1:
            raise ValueError(f"max_checkpoint_bytes must be positive, got {max_checkpoint_bytes}")
        self.keep_last = keep_last
        self.max_checkpoint_bytes = max_checkpoint_bytes

    # -- threads -------------------------------------------------------------------------

    def open_thread(
        self,
        thread_id: str,
        *,
        task: str,
        input: Any = None,
        start_grace: float = 30.0,
        options: Mapping[str, Any] | None = None,
    ) -> tuple[ThreadMeta, bool]:
        """Create the thread as ``queued`` unless it exists; return its meta and whether it
        was created. A new thread is due ``start_grace`` seconds from now, so a lost
        message is re-sent by recovery, and keeps ``options`` (how to send it) in its meta.
        An existing thread is returned unchanged.

        Atomic.
        """
        validate_thread_id(thread_id)
        return self._do_open_thread(
            thread_id, task=task, input=input, start_grace=start_grace, options=options
        )

    @abstractmethod
    def _do_open_thread(
        self,
        thread_id: str,
        *,
        task: str,
        input: Any,
        start_grace: float,
        options: Mapping[str, Any] | None,
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
        and no effect records.

        Raises :class:`~agentq.errors.CheckpointNotFound` if the step is not stored and
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
        it becomes ``queued``, due in ``start_grace`` seconds, with its error, attempts and
        cancel flag cleared and ``resume_value`` stored when given (the next driver reads
        it from the meta). Raises :class:`~agentq.errors.ThreadStateError` for any other
        status and :class:`~agentq.errors.ThreadNotFound` for an unknown thread. Atomic.
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
        """Cancel the thread and return its status afterwards. A ``running`` thread is
        flagged and its driver stops at the next step boundary; ``done``, ``failed`` and
        ``cancelled`` threads stay as they are; any other becomes ``cancelled`` at once and
        leaves the due index. Raises :class:`~agentq.errors.ThreadNotFound`. Atomic."""
        validate_thread_id(thread_id)
        return self._do_request_cancel(thread_id)

    @abstractmethod
    def _do_request_cancel(self, thread_id: str) -> Status: ...

    def put_artifact(self, thread_id: str, data: bytes) -> str:
        """Store ``data`` under its SHA-256 (hex, returned) in the thread's own keyspace;
        storing the same bytes twice keeps one copy. Deleted with the thread. Atomic."""
        validate_thread_id(thread_id)
        return self._do_put_artifact(thread_id, data)

    @abstractmethod
    def _do_put_artifact(self, thread_id: str, data: bytes) -> str: ...

    def get_artifact(self, thread_id: str, digest: str) -> bytes:
        """Return an artifact's bytes; :class:`~agentq.errors.ArtifactNotFound` if absent."""
        validate_thread_id(thread_id)
        return self._do_get_artifact(thread_id, digest)

    @abstractmethod
    def _do_get_artifact(self, thread_id: str, digest: str) -> bytes: ...

    @abstractmethod
    def gc(self, finished_ttl: float) -> int:
        """Delete threads that finished (``done``, ``failed``, ``cancelled``) more than
        ``finished_ttl`` seconds ago; return how many. Each deletion is atomic."""

    # -- lease ---------------------------------------------------------------------------

    def acquire(self, thread_id: str, owner: str, ttl: float) -> int:
        """Take the thread's lease for ``ttl`` seconds and return a new fencing token,
        greater than every token handed out for this thread before.

        An owner may re-acquire its own live lease (and gets a new token). A ``queued``,
        ``retrying`` or ``running`` thread becomes ``running`` and is due when the lease
        expires. Raises :class:`~agentq.errors.LeaseHeld` while another owner's lease is
        live, :class:`~agentq.errors.RetryNotDue` for a ``retrying`` thread before the time
        its ``set_status`` scheduled, and :class:`~agentq.errors.ThreadNotFound` for an
        unknown thread. Atomic.
        """
        validate_thread_id(thread_id)
        check_ttl(thread_id, ttl)
        return self._do_acquire(thread_id, owner, ttl)

    @abstractmethod
    def _do_acquire(self, thread_id: str, owner: str, ttl: float) -> int: ...

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

    # -- checkpoints ---------------------------------------------------------------------

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
        reset to 0; a consumed resume value removed; ``result`` and the ``interrupt``
        payload stored if given, else no interrupt), the status and due indexes (due in
        ``due_in`` seconds, out of the due index when ``None``, as it was when ``UNSET``:
        a running thread's due time follows its lease) and prunes checkpoints
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
    ) -> None:
        """Change the thread's status without a new checkpoint (a retry being scheduled, a
        failure, an interrupt), fenced by ``token`` like ``commit``. Meta values left
        ``UNSET`` stay as they are. A thread set ``retrying`` with ``due_in`` cannot be
        acquired before then. Atomic."""
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

    # -- effects -------------------------------------------------------------------------

    def claim_effect(
        self,
        thread_id: str,
        key: str,
        token: int,
        *,
        shared: bool = False,
        takeover: bool = False,
        claim_id: str = "",
    ) -> Claim:
        """Claim the idempotency record ``key`` of the thread (``shared=True``: the global
        record, across threads).

        A new record is created ``pending`` under ``token`` and the outcome is ``claimed``.
        A ``done`` record answers ``done`` with its result. A ``pending`` one answers
        ``unknown``, or with ``takeover=True`` passes to ``token`` and answers ``claimed``.
        ``claim_id`` names this one call: the same claim sent again (a client retrying
        after its reply was lost) answers ``claimed`` again rather than ``unknown``, since
        no effect can have run in between.

        Raises :class:`~agentq.errors.StaleToken` when ``token`` is not the thread's
        current one. Atomic (for ``shared`` records on Redis Cluster the token check and the
        claim are two steps, because they live in different slots).
        """
        validate_thread_id(thread_id)
        validate_effect_key(key, thread_id)
        return self._do_claim_effect(
            thread_id, key, token, shared=shared, takeover=takeover, claim_id=claim_id
        )

    @abstractmethod
    def _do_claim_effect(
        self, thread_id: str, key: str, token: int, *, shared: bool, takeover: bool, claim_id: str
    ) -> Claim: ...

    def complete_effect(
        self, thread_id: str, key: str, token: int, result: Any, *, shared: bool = False
    ) -> None:
        """Record the effect's result and mark it ``done``. Refused with
        :class:`~agentq.errors.StaleToken` unless ``token`` is current and holds the claim.
        Atomic."""
        validate_thread_id(thread_id)
        validate_effect_key(key, thread_id)
        self._do_complete_effect(thread_id, key, token, result, shared=shared)

    @abstractmethod
    def _do_complete_effect(
        self, thread_id: str, key: str, token: int, result: Any, *, shared: bool
    ) -> None: ...

    def release_effect(
        self, thread_id: str, key: str, token: int, *, claim_id: str, shared: bool = False
    ) -> None:
        """Drop the claim ``claim_id`` (made under ``token``) on ``key``: its call was
        refused before it could take effect (a rate limit), so the next claim runs it
        again instead of finding its outcome unknown. Refused with
        :class:`~agentq.errors.StaleToken` unless ``token`` is current and that claim is
        the pending one (tokens count per thread, a shared key is claimed by several); a
        record already gone is left so. Atomic."""
        validate_thread_id(thread_id)
        validate_effect_key(key, thread_id)
        self._do_release_effect(thread_id, key, token, claim_id=claim_id, shared=shared)

    @abstractmethod
    def _do_release_effect(
        self, thread_id: str, key: str, token: int, *, claim_id: str, shared: bool
    ) -> None: ...

    def effect(self, thread_id: str, key: str, *, shared: bool = False) -> Effect | None:
        """Return the idempotency record, or ``None``."""
        validate_thread_id(thread_id)
        validate_effect_key(key, thread_id)
        return self._do_effect(thread_id, key, shared=shared)

    @abstractmethod
    def _do_effect(self, thread_id: str, key: str, *, shared: bool) -> Effect | None: ...

    # -- recovery ------------------------------------------------------------------------

    @abstractmethod
    def due(self, *, limit: int = 100) -> list[tuple[str, float]]:
        """Return ``(thread_id, due_at)`` for threads due now, earliest first. Read-only."""

    @abstractmethod
    def claim_due(self, *, hold: float, limit: int = 100) -> list[str]:
        """Return the threads due now and push each one's due time ``hold`` seconds ahead,
        so a concurrent sweeper does not send it again before the thread has had time to
        start. Atomic."""

    def lease_sweeper(self, owner: str, ttl: float) -> bool:
        """Take or extend the sweeper's lease for ``ttl`` seconds; ``False`` while another
        owner holds it. Lets one of many workers sweep at a time. Atomic."""
        check_ttl("sweeper", ttl)
        return self._do_lease_sweeper(owner, ttl)

    @abstractmethod
    def _do_lease_sweeper(self, owner: str, ttl: float) -> bool: ...

    # -- operations ----------------------------------------------------------------------

    @abstractmethod
    def check(self) -> list[Finding]:
        """Read the backend's configuration; return what threatens durability, with fixes."""

    @abstractmethod
    def close(self) -> None:
        """Release connections."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @abstractmethod
    def graph(self) -> GraphStore:
        """LangGraph's checkpoints beside this store's threads, on its connections. Each
        call builds a new one (scripts registered, tables created): keep it."""


def check_ttl(thread_id: str, ttl: float) -> None:
    """Refuse a lease TTL that would expire at once (under a millisecond)."""
    if int(ttl * 1000) < 1:
        raise InvalidArgument(
            f"lease ttl must be at least 0.001 s, got {ttl!r}; use the lease_ttl setting "
            "(default 30 s)",
            thread_id=thread_id,
        )


def retry_not_due(thread_id: str, seconds: float) -> RetryNotDue:
    return RetryNotDue(
        f"the thread retries in {seconds:.1f} s (its rate limit's wait); leave it, recovery "
        "sends it then",
        thread_id=thread_id,
        seconds=seconds,
    )
