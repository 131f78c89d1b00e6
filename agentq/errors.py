"""Every exception agentq raises.

All of them derive from :class:`AgentqError` and carry the thread and the step they are
about as attributes, so a handler can act on them without parsing the message.

An error a task raises in a worker comes back from Celery's ``AsyncResult.get()`` as the
same class: pickled with its attributes, or rebuilt from its message alone by the JSON
serializer, which keeps no attributes (those then read ``None``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentq.records import Finding


def missing_extra(what: str, extra: str, exc: ModuleNotFoundError) -> ModuleNotFoundError:
    """The error for ``exc``, raised importing a module that ``agentq[extra]`` installs:
    it names the pip command that installs it."""
    missing = (exc.name or "").partition(".")[0] or str(exc)
    return ModuleNotFoundError(
        f"{what} needs its extra: pip install 'agentq[{extra}]' ({missing} is not installed)",
        name=exc.name,
    )


class AgentqError(Exception):
    """Raised for every agentq failure; the root of the hierarchy."""

    def __init__(self, message: str, *, thread_id: str | None = None, step: int | None = None):
        self.thread_id = thread_id
        self.step = step
        where = []
        if thread_id is not None:
            where.append(f"thread {thread_id!r}")
        if step is not None:
            where.append(f"step {step}")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)


class InvalidArgument(AgentqError, ValueError):
    """Raised when an argument is out of range (a non-positive lease TTL, a negative limit)."""


class InvalidInput(InvalidArgument, TypeError):
    """Raised by ``delay``/``apply_async`` when the input does not fit the entry node's
    signature (a missing or misspelt keyword), before anything is stored or sent; and by
    ``run.tool``/``run.atool`` when the arguments do not fit the tool's, before its call
    is claimed."""


class InvalidThreadId(AgentqError, ValueError):
    """Raised when a thread id is empty, too long, or holds braces or control characters."""


class InvalidEffectKey(InvalidArgument):
    """Raised when an effect key is empty, too long, or holds braces or control characters."""


class ConfigError(AgentqError):
    """Raised when agentq is set up in a way it cannot work with."""


class StoreConfigError(ConfigError):
    """Raised when a store URL or store option cannot be used."""


class SettingsError(ConfigError, ValueError):
    """Raised when an agentq setting is unknown, out of range or contradicts another."""


class UnsafeStore(ConfigError):
    """Raised when a worker or the command line opens a store configured to lose
    acknowledged checkpoints (an evicting ``maxmemory-policy``, no persistence at all).

    ``findings`` are the store's :class:`~agentq.records.Finding` objects that refused it.
    """

    def __init__(self, message: str, *, findings: list[Finding]):
        self.findings = findings
        super().__init__(message)


class StoreUnavailable(AgentqError):
    """Raised when the store cannot be reached (refused, reset, timed out); the store
    client's own exception is its ``__cause__``."""


class CodecError(AgentqError):
    """Raised when a value cannot be turned into stored bytes or back."""


class UnserializableState(CodecError, TypeError):
    """Raised when a checkpoint holds a value msgpack cannot store; names the path to it."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        thread_id: str | None = None,
        step: int | None = None,
    ):
        self.path = path
        super().__init__(message, thread_id=thread_id, step=step)


class CheckpointTooLarge(CodecError):
    """Raised before writing when an encoded checkpoint exceeds the configured size limit."""

    def __init__(
        self,
        message: str,
        *,
        size: int | None = None,
        limit: int | None = None,
        thread_id: str | None = None,
        step: int | None = None,
    ):
        self.size = size
        self.limit = limit
        super().__init__(message, thread_id=thread_id, step=step)


class CorruptCheckpoint(CodecError):
    """Raised when stored bytes do not decode into a checkpoint envelope."""


class UnsupportedVersion(CodecError):
    """Raised when a checkpoint was written by a newer agentq format version than this one."""


class ThreadNotFound(AgentqError, LookupError):
    """Raised when an operation needs a thread that the store does not hold."""


class CheckpointNotFound(AgentqError, LookupError):
    """Raised when a checkpoint step was never written or has been pruned by retention."""


class CheckpointLost(AgentqError):
    """Raised when a thread's meta records committed steps but the store no longer holds
    its latest checkpoint: the store lost data (eviction, a restore from an older backup).
    The thread stops in status ``needs_attention`` instead of starting again from step 0."""


class ArtifactNotFound(AgentqError, LookupError):
    """Raised when an artifact reference names bytes the store does not hold."""


class ThreadStateError(AgentqError):
    """Raised when an operation does not apply to the thread's current status."""

    def __init__(self, message: str, *, thread_id: str, status: str):
        self.status = status
        super().__init__(message, thread_id=thread_id)


class MessageNotSent(AgentqError):
    """Raised when a thread was queued again in the store (resumed, retried, an effect
    settled) but its Celery message could not be sent; the send's own error is its
    ``__cause__``. The thread is not lost, and asking again would be refused: a worker's
    sweeper sends it once it is due. ``status`` is the thread's status (``queued``)."""

    def __init__(self, message: str, *, thread_id: str, status: str):
        self.status = status
        super().__init__(message, thread_id=thread_id)


class FinalCheckpoint(AgentqError, ValueError):
    """Raised when forking the checkpoint a thread finished at: the fork would have no
    node to run."""


class GraphStepMoved(AgentqError, ValueError):
    """Raised when forking a step of a LangGraph thread that is not where its LangGraph
    checkpoints stand: an earlier step, or any step while a worker drives the thread."""


class ThreadExists(AgentqError):
    """Raised when creating a thread (a fork) under an id that is already taken."""


class FencingError(AgentqError):
    """Raised when the store refuses a write from a worker that no longer drives the thread."""


class LeaseHeld(FencingError):
    """Raised when acquiring a thread's lease while another owner's lease is live."""

    def __init__(self, message: str, *, thread_id: str, ttl_ms: int):
        self.ttl_ms = ttl_ms
        super().__init__(message, thread_id=thread_id)


class RetryNotDue(AgentqError):
    """Raised when acquiring a ``retrying`` thread before its retry time, or a ``waiting``
    one before its timeout: a message sent early (a repeated ``delay``, a redelivery) must
    not cut a provider's Retry-After or a person's time to answer short."""

    def __init__(self, message: str, *, thread_id: str, seconds: float):
        self.seconds = seconds
        super().__init__(message, thread_id=thread_id)


class LeaseLost(FencingError):
    """Raised when renewing or releasing a lease that expired or passed to another worker."""


class StaleToken(FencingError):
    """Raised when a commit or claim carries a fencing token older than the thread's current one."""


class StepConflict(FencingError):
    """Raised when committing step n while the latest stored step is not n-1."""

    def __init__(
        self,
        message: str,
        *,
        thread_id: str | None = None,
        step: int | None = None,
        latest: int | None = None,
    ):
        self.latest = latest
        super().__init__(message, thread_id=thread_id, step=step)


class LogConflict(FencingError):
    """Raised when an append-only log does not end where a commit continues it."""


class AppendOnlyViolation(AgentqError):
    """Raised when an item of an append-only state field changed after it was committed."""

    def __init__(
        self,
        message: str,
        *,
        thread_id: str | None = None,
        step: int | None = None,
        field: str | None = None,
        index: int | None = None,
    ):
        self.field = field
        self.index = index
        super().__init__(message, thread_id=thread_id, step=step)


class EffectError(AgentqError):
    """Raised when an idempotency record cannot be claimed or completed as asked."""


class ArtifactTooLarge(AgentqError):
    """Raised before storing an artifact larger than ``max_artifact_bytes``."""


class NeedsAttention(AgentqError):
    """Raised when a tool call's outcome is unknown and its policy cannot settle it.

    The thread stops in status ``needs_attention``; ``key`` and ``tool`` name the call.
    """

    def __init__(self, message: str, *, thread_id: str, step: int, key: str, tool: str):
        self.key = key
        self.tool = tool
        super().__init__(message, thread_id=thread_id, step=step)


class UnknownNode(AgentqError):
    """Raised when a node names a next node the agent does not define, or returns
    something that is not a node name, ``Done`` or ``Interrupt``."""


class ReentrantRunCoroutine(AgentqError, RuntimeError):
    """Raised when a coroutine running on agentq's event loop asks that loop to run another
    coroutine and wait for it, which would never end; it should ``await`` it instead."""


class BlockingOnLoop(RuntimeWarning):
    """Warned when an ``async def`` node makes a blocking call (``run.tool``,
    ``run.artifacts.put``) on the event loop its worker process's async nodes share; the
    awaited form (``run.atool``, ``run.artifacts.aput``) runs the store's round trips off it."""


class UnsupportedPool(ConfigError):
    """Raised when an ``async def`` node runs under a worker pool agentq's event loop cannot
    share the process with (``-P eventlet``)."""


class ThreadStopped(AgentqError):
    """Raised by ``wait()`` when a thread ends without a result: failed, cancelled,
    waiting for a human or needing attention. ``status`` and ``error`` say which."""

    def __init__(self, message: str, *, thread_id: str, status: str, error: str | None):
        self.status = status
        self.error = error
        super().__init__(message, thread_id=thread_id)


class WaitTimeout(AgentqError, TimeoutError):
    """Raised by ``wait()`` when the thread has not finished within the timeout."""


class InterruptTimedOut(AgentqError, TimeoutError):
    """Raised by ``run.interrupt()`` (or ``run.resume_value`` after an ``Interrupt``) when
    nobody answered within the wait's ``timeout``; ``payload`` is the question that went
    unanswered and ``timeout`` the seconds it waited. Catch it to take another path;
    uncaught, it fails the thread as any node error does."""

    def __init__(
        self,
        message: str,
        *,
        payload: Any = None,
        timeout: float | None = None,
        thread_id: str | None = None,
        step: int | None = None,
    ):
        self.payload = payload
        self.timeout = timeout
        super().__init__(message, thread_id=thread_id, step=step)


class LimitError(ConfigError, ValueError):
    """Raised when a rate limit is declared badly, or a call names one never declared or
    asks for more than it could ever grant."""
