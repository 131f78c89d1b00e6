"""The typed records a store hands back: thread meta, checkpoints, effect records."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple


class Status(StrEnum):
    """Where a thread is in its life. Stored as the plain string value."""

    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    RETRYING = "retrying"
    DONE = "done"
    FAILED = "failed"
    NEEDS_ATTENTION = "needs_attention"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        """True for the statuses retention may expire: nothing will run the thread again."""
        return self in FINISHED

    @property
    def is_live(self) -> bool:
        """True while something should run the thread: it is queued, running or retrying,
        and has a due time in the recovery index (but for a thread parked on a full
        concurrency key, which waits in the key's queue instead)."""
        return self in LIVE

    @property
    def is_idle(self) -> bool:
        """True when nothing runs the thread until a person acts (resume, retry) or ever
        again (failed, cancelled); ``done`` is neither live nor idle: it has its result."""
        return self in IDLE


FINISHED = frozenset({Status.DONE, Status.FAILED, Status.CANCELLED})
LIVE = frozenset({Status.QUEUED, Status.RUNNING, Status.RETRYING})
IDLE = frozenset({Status.WAITING, Status.FAILED, Status.CANCELLED, Status.NEEDS_ATTENTION})


def step_at(status: Status, latest: int) -> int:
    """The step a thread is at, numbered as the store numbers checkpoints (step n writes
    checkpoint n): its last one when done, else the one after its ``latest`` checkpoint,
    which is running, retrying, failed or waiting to run, and which errors name. The
    command line and the inspector both show this, so the two never disagree."""
    return latest if status == Status.DONE else latest + 1


MAX_NUMBER = 2**53
"""The largest step, count or offset a person may give the command line or the inspector:
above any a store holds, and within SQLite's 64-bit integers (and the whole numbers JSON
keeps exact), so a larger one is refused as bad input rather than overflowing a query."""


@dataclass(frozen=True)
class Checkpoint:
    """One snapshot of a thread: enough to continue as if nothing had happened.

    ``step`` and ``node`` are the program counter (``node`` is ``None`` once the thread has
    finished); ``state`` is the user's accumulated state; ``pending`` the tool calls decided
    but not yet recorded; ``cursors`` progress through the outside world. ``token`` is the
    fencing token of the worker that wrote it and ``created_at`` a Unix time. ``logs`` is
    how it was stored, not part of it: the state fields kept in append-only logs, with
    their lengths.
    """

    step: int
    node: str | None
    state: dict[str, Any] = field(default_factory=dict)
    pending: list[Any] = field(default_factory=list)
    cursors: dict[str, Any] = field(default_factory=dict)
    task: str = ""
    token: int = 0
    created_at: float = 0.0
    logs: dict[str, int] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class ThreadMeta:
    """What a store knows about a thread besides its checkpoints.

    ``step`` is the latest committed step (-1 before the first commit) and ``node`` the one
    that runs next: the task's entry node before the first commit (``None`` for a thread
    opened without one), ``None`` once finished. ``fence`` is the highest fencing token
    handed out for the thread. ``input``, ``result``, ``interrupt`` and ``resume_value``
    are decoded values; ``None`` when absent (``resumed`` tells a resume with ``None``
    from no resume).
    """

    thread_id: str
    status: Status
    step: int
    node: str | None
    task: str
    attempts: int
    crashes: int
    fence: int
    error: str | None
    created_at: float
    updated_at: float
    input: Any = None
    result: Any = None
    interrupt: Any = None
    resume_value: Any = None
    resumed: bool = False
    cancel_requested: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    """The Celery routing options the thread was first sent with (queue, priority, ...),
    reused for every later send."""
    incarnation: str | None = None
    """A random id the thread got when it was created (a fork gets its own). The
    idempotency keys its tools send downstream derive from it, so a thread id deleted and
    created again, or the same id in another deployment, is another thread to the services
    they call. ``None`` for a thread created before agentq stored one."""
    reopened: bool = False
    """Whether a person has sent the thread on since it was created (a resume, a retry, a
    tool call settled): their word outranks a revoke of its first task."""
    origin: str | None = None
    """The id of the Celery task that first sent the thread, whose result the caller of
    ``delay()`` holds: the task that ends the thread stores the outcome under it too."""
    canvas: dict[str, Any] | None = None
    """The callbacks, errbacks, chain and chord the first message carried, in the shape of
    Celery's request fields, encoded as the message encoded them (``content_type``,
    ``encoding``, ``body``); the task that ends the thread, if it is not the
    first one, applies them. Never sent with a later message."""
    timeout: float | None = None
    """The seconds a wait for a human may last (``interrupt(..., timeout=)``), kept from
    the pause until a step after it commits."""
    timeout_at: float | None = None
    """When a ``waiting`` thread with a timeout stops waiting (a Unix time on the store's
    clock); it is also the thread's due time. ``None`` for any other thread."""
    timed_out: bool = False
    """Whether the thread's wait ended by its timeout, until a step after it commits: the
    node that runs then sees :class:`~agentq.errors.InterruptTimedOut`, and ``interrupt``
    holds the question nobody answered."""

    @property
    def runs_by_itself(self) -> bool:
        """True while the thread will run again with nobody acting: it is live, or waits
        for a human with a timeout (it runs on when the timeout passes)."""
        return self.status.is_live or (
            self.status == Status.WAITING and self.timeout_at is not None
        )

    @property
    def resumable_from(self) -> frozenset[Status]:
        """The statuses ``resume`` reopens this thread from: ``waiting``, and ``failed``
        while it holds an answer no step consumed (the node given it failed, so a new
        answer replaces it)."""
        if self.resumed:
            return frozenset({Status.WAITING, Status.FAILED})
        return frozenset({Status.WAITING})


class EffectState(StrEnum):
    """Where an idempotency record is. Stored as the plain string value."""

    PENDING = "pending"
    """Claimed, its result not recorded yet."""
    DONE = "done"
    """Completed: the record holds the effect's result."""


class ClaimOutcome(StrEnum):
    """What claiming an effect key found (see :class:`Claim`)."""

    CLAIMED = "claimed"
    DONE = "done"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Effect:
    """An idempotency record: ``state`` is ``pending`` from its claim until completed ``done``."""

    key: str
    state: EffectState
    token: int
    result: Any = None
    tool: str | None = None
    """The name of the function claimed under the key (its ``__qualname__``)."""
    claimed_at: float | None = None
    """When the latest claim was made (Unix time, the store's clock)."""
    claimed_by: str | None = None
    """The thread whose worker made the latest claim: the record's own thread, or for a
    shared record any thread that uses the key (the one it was settled for, once an
    operator settled it). ``None`` for a shared record claimed by an agentq that did not
    keep it."""


@dataclass(frozen=True)
class Claim:
    """The answer to claiming an effect key.

    ``outcome`` is ``claimed`` (the caller owns the key now and must run the effect),
    ``done`` (it already ran: ``effect.result`` is its recorded result) or ``unknown`` (an
    earlier driver claimed it and never recorded an outcome: it may or may not have run).
    """

    outcome: ClaimOutcome
    effect: Effect


@dataclass(frozen=True)
class Finding:
    """A store configuration problem found by ``check()``, with the fix.

    A ``fatal`` one loses acknowledged checkpoints in normal operation (eviction, no
    persistence): workers and the command line refuse such a store.
    """

    setting: str
    value: str
    problem: str
    fix: str
    fatal: bool = False

    def __str__(self) -> str:
        return f"{self.setting}={self.value}: {self.problem} Fix: {self.fix}"


@dataclass(frozen=True)
class Schedule:
    """Who drives a thread now and when it must run, as an operator reads it.

    ``owner`` and ``token`` are the live lease's (``None`` when nobody holds it), with
    ``lease_left`` seconds to go; ``due_at`` is the Unix time at which recovery sends the
    thread (``None`` when it is not in the due index: finished, cancelled, waiting
    without a timeout).
    """

    thread_id: str
    owner: str | None = None
    token: int | None = None
    lease_left: float | None = None
    due_at: float | None = None


class ListedThread(NamedTuple):
    """A thread as a list of threads shows it: the short fields of its meta, what its note
    needs (the question of a ``waiting`` thread, the result of a ``done`` one, ``None``
    otherwise) and the owner of its live lease (``running`` threads only). A tuple: a page
    builds 50 of them, at a quarter of a frozen dataclass's cost each."""

    thread_id: str
    status: Status
    step: int
    node: str | None
    task: str
    attempts: int
    crashes: int
    updated_at: float
    error: str | None
    cancel_requested: bool
    interrupt: Any = None
    result: Any = None
    owner: str | None = None
    cursor: str = ""
    """Where the list goes on after this row: ``Store.listing(after=cursor)``."""


@dataclass(frozen=True)
class Listing:
    """How many threads are in each status (zeros included) and one page of them."""

    counts: dict[Status, int]
    rows: list[ListedThread]
