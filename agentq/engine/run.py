"""What a node sees: the thread's state, its pending tool calls, and effects under claims."""

from __future__ import annotations

import datetime
import inspect
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar, overload

from agentq.engine import aio, limits, tracing
from agentq.engine.artifacts import Artifacts
from agentq.engine.backoff import retry_after
from agentq.engine.store_retry import RetriedCalls
from agentq.engine.tool_policy import DID_NOT_RUN, ToolPolicy, policy_of
from agentq.errors import InterruptTimedOut, InvalidArgument, LimitError, NeedsAttention
from agentq.outcomes import Interrupted, LimitWait, wait_seconds
from agentq.records import ClaimOutcome
from agentq.store.contract import Store


class _NoValue:
    def __repr__(self) -> str:
        return "NO_VALUE"


NO_VALUE: Final = _NoValue()
"""``run.resume_value`` when the thread was not resumed with a value."""

logger = logging.getLogger("agentq")

R = TypeVar("R")


@dataclass(frozen=True)
class TimedOut:
    """The resume value of a run whose thread's wait for a human ended by its timeout:
    the question nobody answered, and the seconds it waited."""

    payload: Any
    timeout: float | None


class Run:
    """One node execution. ``state``, ``pending`` and ``cursors`` are committed with the
    step when the node returns; ``step`` is the number that commit will carry."""

    def __init__(
        self,
        *,
        store: Store,
        thread_id: str,
        step: int,
        node: str,
        token: int,
        state: dict[str, Any],
        pending: list[Any],
        cursors: dict[str, Any],
        resume_value: Any,
        max_artifact_bytes: int,
        calls: RetriedCalls,
        confirm_lease: Callable[[], None],
        retryable: Callable[[BaseException], bool],
        take_limits: Callable[..., limits.Held] | None = None,
    ) -> None:
        self.thread_id = thread_id
        self.step = step
        self.node = node
        self.state = state
        self.pending = pending
        self.cursors = cursors
        self._resume_value = resume_value
        self.artifacts = Artifacts(store, calls, thread_id, max_artifact_bytes)
        self._store = store
        self._store_calls = calls
        self._token = token
        self._confirm_lease = confirm_lease
        self._retryable = retryable
        self._take_limits = take_limits
        self._calls = 0
        self._answered = False
        self.limit_waits: list[dict[str, Any]] = []
        """This step's waits for its limits: ``keys`` and ``waited`` seconds in place, or
        ``due_at`` (Unix time) for the wait that ended the step."""

    @property
    def token(self) -> int:
        """The fencing token of the lease this run executes under: pass it with writes to
        other stores that should refuse a worker which lost the thread."""
        return self._token

    @property
    def resume_value(self) -> Any:
        """The value the thread was resumed with (``resume(thread_id, value)``), in the
        node it resumed at; ``NO_VALUE`` in any other run. Raises
        :class:`~agentq.errors.InterruptTimedOut` in the node an
        ``Interrupt(..., timeout=)`` continued at when nobody answered in time."""
        if isinstance(self._resume_value, TimedOut):
            raise self._timed_out(self._resume_value)
        return self._resume_value

    def interrupt(self, payload: Any, *, timeout: float | datetime.timedelta | None = None) -> Any:
        """Pause for a human: the thread becomes ``waiting`` with ``payload`` stored, and
        this node runs again from its start on ``resume(thread_id, value)``, when this
        call returns ``value``. Changes made by this node before the call are not kept.
        One call per node run: a second one, after the first was answered (or timed
        out), raises :class:`~agentq.errors.InvalidArgument` (the thread fails, saying so).

        With ``timeout`` (seconds, or a ``timedelta``) the thread is due in the store's
        due index then, as a retry is: if nobody resumed it by that time, the node runs
        again and this call raises :class:`~agentq.errors.InterruptTimedOut`; catch it to
        take another path. A resume and the timeout are decided by the store, one of them:
        a resume in time wins and the timeout never fires; a later one is refused."""
        seconds = wait_seconds(timeout, thread_id=self.thread_id, step=self.step)
        if self._answered:
            # Its answer would reach the first question when the node runs again.
            raise InvalidArgument(
                "a node asks one question: this one called run.interrupt() again after "
                "its first question was answered or timed out; ask both in one payload, "
                "or move the second question to a node of its own",
                thread_id=self.thread_id,
                step=self.step,
            )
        if self._resume_value is NO_VALUE:
            raise Interrupted(payload, seconds)
        value, self._resume_value = self._resume_value, NO_VALUE
        self._answered = True
        if isinstance(value, TimedOut):
            raise self._timed_out(value)
        return value

    def _timed_out(self, wait: TimedOut) -> InterruptTimedOut:
        waited = "" if wait.timeout is None else f" within {wait.timeout:g} s"
        return InterruptTimedOut(
            f"nobody answered the interrupt{waited}; catch agentq.errors.InterruptTimedOut "
            "in the node to take another path, or give people a longer timeout",
            payload=wait.payload,
            timeout=wait.timeout,
            thread_id=self.thread_id,
            step=self.step,
        )

    def tool(
        self,
        fn: Callable[..., R],
        *args: Any,
        key: str | None = None,
        idempotent: bool | None = None,
        reconcile: Callable[..., Any] | None = None,
        shared: bool | None = None,
        limit: str | Sequence[str] | None = None,
        cost: float = 0,
        actual_cost: Callable[[Any], float] | None = None,
        **kwargs: Any,
    ) -> R:
        """Call ``fn(*args, **kwargs)`` at most once per ``key``; a replay returns the
        recorded result. Typed as ``fn``'s result; the arguments are not checked against
        ``fn`` by a type checker (``ParamSpec`` cannot carry ``key=`` and the other
        options beside them), only when the call is made.

        ``key`` defaults to the step and the call's position in the node (deterministic:
        a re-run node makes the same calls in the same order); pass the model's tool-call
        id when there is one. ``fn`` receives a key for its service as ``idempotency_key``
        (see :meth:`~agentq.store.contract.Store.downstream_key`: unique to the thread, the
        key and the store's prefix) and the lease's fencing token as ``fencing_token`` if
        it has parameters of those names: a service
        that keeps the highest token it saw per thread can refuse a worker that was frozen
        between its claim and the call, which nothing on this side can stop.
        ``idempotent``/``reconcile``/``shared`` override the policy
        declared with :func:`agentq.tool` (see :class:`~agentq.engine.tool_policy.ToolPolicy`).

        ``limit`` names one or more declared limits (:func:`agentq.limit`) the call takes
        one request, ``cost`` tokens and a concurrency slot from, fleet-wide, before it
        runs; a replay takes nothing. ``actual_cost(result)`` (e.g. ``lambda r:
        r.usage.total_tokens``) gives the tokens the call really used once it returned, and
        the difference from ``cost`` is charged or refunded (a replay settles nothing). A
        refusal with ``Retry-After`` pauses those keys for every worker until then.

        If ``fn`` raises an error the task retries (``retry_on``, ``should_retry``) that
        carries a ``Retry-After`` (a 429 or 503 from the tool's API), the call was refused
        before it took effect: its claim is dropped and the retried node calls it again
        with the same key. Any other error leaves the claim pending, a timeout included,
        since the effect may have happened; the tool's policy decides when the node runs
        again. ``async def`` tools go through :meth:`atool`.
        """
        if inspect.iscoroutinefunction(fn):
            raise InvalidArgument(
                f"tool {_name(fn)} is a coroutine function; in an async node call it with "
                "await run.atool(...)",
                thread_id=self.thread_id,
                step=self.step,
            )
        options = _Options(key, idempotent, reconcile, shared, limit, cost, actual_cost)
        result: R = _drive(self._effect(fn, args, kwargs, options, _inline, _called_plain))
        return result

    @overload
    async def atool(
        self,
        fn: Callable[..., Awaitable[R]],
        *args: Any,
        key: str | None = None,
        idempotent: bool | None = None,
        reconcile: Callable[..., Any] | None = None,
        shared: bool | None = None,
        limit: str | Sequence[str] | None = None,
        cost: float = 0,
        actual_cost: Callable[[Any], float] | None = None,
        **kwargs: Any,
    ) -> R: ...

    @overload
    async def atool(
        self,
        fn: Callable[..., R],
        *args: Any,
        key: str | None = None,
        idempotent: bool | None = None,
        reconcile: Callable[..., Any] | None = None,
        shared: bool | None = None,
        limit: str | Sequence[str] | None = None,
        cost: float = 0,
        actual_cost: Callable[[Any], float] | None = None,
        **kwargs: Any,
    ) -> R: ...

    async def atool(
        self,
        fn: Callable[..., Any],
        *args: Any,
        key: str | None = None,
        idempotent: bool | None = None,
        reconcile: Callable[..., Any] | None = None,
        shared: bool | None = None,
        limit: str | Sequence[str] | None = None,
        cost: float = 0,
        actual_cost: Callable[[Any], float] | None = None,
        **kwargs: Any,
    ) -> Any:
        """:meth:`tool` for an ``async def`` tool, awaited in the node's event loop; the
        claim, the policies and ``reconcile`` (a plain function) are the same. A plain
        function works too: its result is recorded as it is.

        The store's round trips (claim, record) run off the loop, in the pool slot waiting
        for the node, so a slow store never stalls the other nodes sharing the loop."""
        options = _Options(key, idempotent, reconcile, shared, limit, cost, actual_cost)
        return await self._effect(fn, args, kwargs, options, aio.blocking, _called_awaited)

    async def _effect(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: _Options,
        offload: Callable[..., Awaitable[Any]],
        invoke: Callable[..., Awaitable[Any]],
    ) -> Any:
        """One tool call from its claim to its record; ``offload`` runs the store's calls,
        ``invoke`` the tool itself."""
        if options.actual_cost is not None and options.limit is None:
            # Before the claim, which would otherwise be left pending.
            raise InvalidArgument(
                "actual_cost= settles a limit's tokens; name the limit with limit=",
                thread_id=self.thread_id,
                step=self.step,
            )
        with tracing.tool_span(self.thread_id, self.step, _name(fn), self._token) as note:
            call = await offload(self._claim, fn, args, kwargs, options)
            if call.recorded is not NO_VALUE:
                note(call.key, "replayed")
                return call.recorded
            held = None if options.limit is None else await offload(self._limit, call, options)
            try:
                result = await invoke(fn, args, call.kwargs)
            except Exception as exc:
                if held is not None and self._retryable(exc):
                    await offload(held.refused, exc)
                await offload(self._failed, call, exc)
                raise
            finally:
                if held is not None:
                    await offload(held.release)
            note(call.key, "called")
            recorded = await offload(self._record, call, result)
            if held is not None and options.actual_cost is not None:
                await offload(held.settle, options.actual_cost, result)
            return recorded

    def _limit(self, call: _Call, options: _Options) -> limits.Held:
        """Take the call's limits; a wait too long for the step drops its claim, so the
        retried step claims the call afresh."""
        if self._take_limits is None:
            raise InvalidArgument(
                f"limit={options.limit!r} needs the limits declared with init_app(app, "
                "limits=[agentq.limit(...)])",
                thread_id=self.thread_id,
                step=self.step,
            )
        try:
            held = self._take_limits(options.limit, options.cost)
        except LimitWait as wait:
            self.limit_waits.append({"keys": list(wait.keys), "due_at": time.time() + wait.seconds})
            self._drop_claim(call, "its limit has no room")
            raise
        except LimitError:  # the call never ran: a retried thread claims it afresh
            self._drop_claim(call, "its limit refused the call")
            raise
        if held.waited:
            self.limit_waits.append({"keys": list(held.keys), "waited": held.waited})
        return held

    def _claim(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: _Options,
    ) -> _Call:
        """Claim the call's key; settle an outcome already recorded or left unknown."""
        declared = policy_of(fn)
        policy = ToolPolicy(
            idempotent=declared.idempotent if options.idempotent is None else options.idempotent,
            reconcile=declared.reconcile if options.reconcile is None else options.reconcile,
            shared=declared.shared if options.shared is None else options.shared,
        )
        self._calls += 1
        key = options.key if options.key is not None else f"step{self.step}.call{self._calls}"
        # Names this call, so that a claim resent after a lost reply is known as ours.
        claim_id = uuid.uuid4().hex
        store, thread_id = self._store, self.thread_id
        downstream = store.downstream_key(thread_id, key, shared=policy.shared)
        call = _Call(key, downstream, claim_id, policy.shared, dict(kwargs))
        claim = self._store_calls(
            "claiming a tool call",
            store.claim_effect,
            thread_id,
            key,
            self._token,
            shared=policy.shared,
            claim_id=claim_id,
            tool=_name(fn),
        )
        if claim.outcome == ClaimOutcome.DONE:
            call.recorded = claim.effect.result
            return call
        if claim.outcome == ClaimOutcome.UNKNOWN:
            if not (policy.idempotent or policy.reconcile):
                name = _name(fn)
                raise NeedsAttention(
                    f"tool {name} with key {key!r} was started by an earlier worker that "
                    "died before recording its outcome, and it declares neither "
                    "idempotent=True nor reconcile=; check whether it happened, then "
                    f"settle it: agentq resolve {thread_id} {key} --result JSON (what "
                    "it returned) or --did-not-run (it runs once more); 'agentq effects "
                    f"{thread_id}' lists the thread's calls (in code: task.resolve_effect)",
                    thread_id=thread_id,
                    step=self.step,
                    key=key,
                    tool=name,
                )
            self._store_calls(
                "taking a tool call over",
                store.claim_effect,
                thread_id,
                key,
                self._token,
                shared=policy.shared,
                takeover=True,
                claim_id=claim_id,
                tool=_name(fn),
            )
            if policy.reconcile is not None:
                found = policy.reconcile(call.downstream, *args, **kwargs)
                if found is not DID_NOT_RUN:
                    call.recorded = self._record(call, found)
                    return call
        parameters = inspect.signature(fn).parameters
        if "idempotency_key" in parameters:
            call.kwargs["idempotency_key"] = downstream
        if "fencing_token" in parameters:
            call.kwargs["fencing_token"] = self._token
        # A worker paused since its claim may have been replaced meanwhile: renewing the
        # lease here, as late as possible, stops it before the effect rather than after.
        self._confirm_lease()
        return call

    def _record(self, call: _Call, result: Any) -> Any:
        self._store_calls(
            "recording a tool call",
            self._store.complete_effect,
            self.thread_id,
            call.key,
            self._token,
            result,
            shared=call.shared,
        )
        return result

    def _failed(self, call: _Call, exc: Exception) -> None:
        # Only a refusal that names when to come back proves nothing happened: retry_on
        # often lists timeouts too, and a timeout can come after the effect.
        if self._retryable(exc) and retry_after(exc) is not None:
            self._drop_claim(call, repr(exc))

    def _drop_claim(self, call: _Call, why: str) -> None:
        try:
            self._store_calls(
                "dropping a tool call's claim",
                self._store.release_effect,
                self.thread_id,
                call.key,
                self._token,
                claim_id=call.claim_id,
                shared=call.shared,
            )
        except Exception:
            # The tool's own error is the one to report; a claim left pending only makes
            # the retried call ask its policy.
            logger.warning(
                "thread %s: could not drop the claim of %r (%s)",
                self.thread_id,
                call.key,
                why,
                exc_info=True,
            )


@dataclass(frozen=True)
class _Options:
    """What a ``tool``/``atool`` call says about itself, over the tool's declared policy."""

    key: str | None
    idempotent: bool | None
    reconcile: Callable[..., Any] | None
    shared: bool | None
    limit: str | Sequence[str] | None = None
    cost: float = 0
    actual_cost: Callable[[Any], float] | None = None


@dataclass
class _Call:
    """One tool call between its claim and its record."""

    key: str
    downstream: str
    """The key the tool forwards to the service it calls (``idempotency_key``)."""
    claim_id: str
    shared: bool
    kwargs: dict[str, Any]
    recorded: Any = NO_VALUE
    """The outcome already recorded (a replay) or reconciled, else ``NO_VALUE``."""


async def _inline(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


async def _called_plain(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Any) -> Any:
    return fn(*args, **kwargs)


async def _called_awaited(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Any) -> Any:
    result = fn(*args, **kwargs)
    return await result if inspect.isawaitable(result) else result


def _drive(coro: Coroutine[Any, Any, Any]) -> Any:
    """The result of a coroutine that never suspends (``tool``'s, whose every step is
    plain), without an event loop."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("a plain tool call suspended")


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", repr(fn))
