"""What a node sees: the thread's state, its pending tool calls, and effects under claims."""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, ParamSpec, TypeVar, TypeVarTuple, Unpack, overload

from agentq.engine import limits
from agentq.engine.artifacts import Artifacts
from agentq.engine.store_retry import RetriedCalls
from agentq.engine.tool_calls import Options, ToolCalls
from agentq.engine.tool_types import TakesKey, TakesKeyAndToken, TakesToken, ToolOptions
from agentq.errors import InterruptTimedOut, InvalidArgument
from agentq.outcomes import Interrupted, wait_seconds
from agentq.store.contract import Store


class _NoValue:
    def __repr__(self) -> str:
        return "NO_VALUE"


NO_VALUE: Final = _NoValue()
"""``run.resume_value`` when the thread was not resumed with a value."""

R = TypeVar("R")
P = ParamSpec("P")
Ts = TypeVarTuple("Ts")


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
        incarnation: str | None,
        step: int,
        node: str,
        token: int,
        state: dict[str, Any],
        pending: list[Any],
        cursors: dict[str, Any],
        resume_value: Any,
        retries: int,
        lost_workers: int,
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
        self.retries = retries
        """How many times this step failed with a ``retry_on`` error before this run (0 on
        its first run), as Celery's ``request.retries`` counts a task's. Its commit clears
        it; after ``max_attempts`` the thread fails."""
        self.lost_workers = lost_workers
        """How many workers were lost running this step before this run; its commit
        clears it, and at ``max_crashes`` the thread fails."""
        self.artifacts = Artifacts(
            store, calls, thread_id, max_artifact_bytes, step, in_node=self._in_node
        )
        self._token = token
        self._tools = ToolCalls(
            store=store,
            calls=calls,
            thread_id=thread_id,
            incarnation=incarnation,
            step=step,
            token=token,
            confirm_lease=confirm_lease,
            retryable=retryable,
            take_limits=take_limits,
        )
        self._answered = False
        self._ended = False
        self.limit_waits: list[dict[str, Any]] = self._tools.limit_waits
        """This step's waits for its limits: ``keys`` and ``waited`` seconds in place, or
        ``due_at`` (Unix time) for the wait that ended the step."""

    def end(self) -> None:
        """Note that the node returned (or raised): its step is being committed, and a
        tool call, artifact or question from here on would belong to no step."""
        self._ended = True

    def _in_node(self, what: str) -> None:
        if self._ended:
            raise InvalidArgument(
                f"run.{what}() was called after node {self.node!r} returned, on the run of "
                "its step, which is committed without it; call it within the node, and "
                "keep no run beyond it (in self, a global, a thread or task the node "
                "does not wait for): each node gets its own run",
                thread_id=self.thread_id,
                step=self.step,
            )

    def got_past(self) -> None:
        """Note that the store cleared this step's failed attempts and lost workers with
        progress the node saved itself (a graph's super-step), as a commit clears them: a
        failure from here on is the step's first again."""
        self.retries = self.lost_workers = 0

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
        self._in_node("interrupt")
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

    # A type checker takes the first of these a call fits: the tool's arguments positionally
    # beside options (a tool taking idempotency_key or fencing_token has them left out),
    # then its own signature without options, then keyword arguments beside key=, which
    # come from a model's tool call and are checked only when the call is made.
    @overload
    def tool(
        self,
        fn: Callable[[*Ts], R] | TakesKey[*Ts, R],
        /,
        *args: *Ts,
        **options: Unpack[ToolOptions],
    ) -> R: ...

    @overload
    def tool(
        self,
        fn: Callable[[*Ts], R] | TakesToken[*Ts, R],
        /,
        *args: *Ts,
        **options: Unpack[ToolOptions],
    ) -> R: ...

    @overload
    def tool(
        self,
        fn: Callable[[*Ts], R] | TakesKeyAndToken[*Ts, R],
        /,
        *args: *Ts,
        **options: Unpack[ToolOptions],
    ) -> R: ...

    @overload
    def tool(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R: ...

    @overload
    def tool(  # type: ignore[overload-cannot-match]  # P above does not take key=
        self,
        fn: Callable[..., R],
        /,
        *,
        key: str,
        idempotent: bool | None = None,
        reconcile: Callable[..., Any] | None = None,
        shared: bool | None = None,
        limit: str | Sequence[str] | None = None,
        cost: float = 0,
        actual_cost: Callable[[Any], float] | None = None,
        **kwargs: Any,
    ) -> R: ...

    # A tool's own parameters named fn or as the options (key, cost, ...) cannot be passed
    # by keyword: the signature without options holds for the tools without them.
    def tool(  # type: ignore[misc]
        self,
        fn: Callable[..., Any],
        *args: object,
        key: str | None = None,
        idempotent: bool | None = None,
        reconcile: Callable[..., Any] | None = None,
        shared: bool | None = None,
        limit: str | Sequence[str] | None = None,
        cost: float = 0,
        actual_cost: Callable[[Any], float] | None = None,
        **kwargs: Any,
    ) -> Any:
        """Call ``fn(*args, **kwargs)`` at most once per ``key``; a replay returns the
        recorded result, typed as ``fn``'s.

        A type checker checks the arguments against ``fn``: those passed positionally,
        beside any of the options below, and all of them in a call without options. The
        arguments of a call passing them by keyword beside ``key=`` (from a model's tool
        call: ``run.tool(fn, key=call["id"], **call["args"])``) are checked when it is
        made. ``fn``'s ``idempotency_key`` and ``fencing_token`` are never the caller's.

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
        r["usage"]["total_tokens"]``: the result is recorded, so plain data) gives the tokens
        the call really used once it returned, and the difference from ``cost`` is charged
        or refunded (a replay settles nothing). A refusal with ``Retry-After`` pauses those
        keys for every worker until then.

        If ``fn`` raises an error the task retries (``retry_on``, ``should_retry``) that
        carries a ``Retry-After`` (a 429 or 503 from the tool's API), the call was refused
        before it took effect: its claim is dropped and the retried node calls it again
        with the same key. Any other error leaves the claim pending, a timeout included,
        since the effect may have happened; the tool's policy decides when the node runs
        again. ``async def`` tools go through :meth:`atool`.
        """
        self._in_node("tool")
        options = Options(key, idempotent, reconcile, shared, limit, cost, actual_cost)
        result: Any = self._tools.plain(fn, args, kwargs, options)
        return result

    # As tool's, an async tool's first, whose awaited result is the call's.
    @overload
    async def atool(
        self,
        fn: Callable[[*Ts], Awaitable[R]] | TakesKey[*Ts, Awaitable[R]],
        /,
        *args: *Ts,
        **options: Unpack[ToolOptions],
    ) -> R: ...

    @overload
    async def atool(
        self,
        fn: Callable[[*Ts], Awaitable[R]] | TakesToken[*Ts, Awaitable[R]],
        /,
        *args: *Ts,
        **options: Unpack[ToolOptions],
    ) -> R: ...

    @overload
    async def atool(
        self,
        fn: Callable[[*Ts], Awaitable[R]] | TakesKeyAndToken[*Ts, Awaitable[R]],
        /,
        *args: *Ts,
        **options: Unpack[ToolOptions],
    ) -> R: ...

    @overload
    async def atool(
        self,
        fn: Callable[[*Ts], R] | TakesKey[*Ts, R],
        /,
        *args: *Ts,
        **options: Unpack[ToolOptions],
    ) -> R: ...

    @overload
    async def atool(
        self,
        fn: Callable[[*Ts], R] | TakesToken[*Ts, R],
        /,
        *args: *Ts,
        **options: Unpack[ToolOptions],
    ) -> R: ...

    @overload
    async def atool(
        self,
        fn: Callable[[*Ts], R] | TakesKeyAndToken[*Ts, R],
        /,
        *args: *Ts,
        **options: Unpack[ToolOptions],
    ) -> R: ...

    @overload
    async def atool(
        self, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> R: ...

    @overload
    async def atool(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R: ...

    # Options stay in **kwargs here: typed out, a dict[str, Any] unpacked into them makes
    # both of these match an async tool, and its result Any.
    @overload
    async def atool(  # type: ignore[overload-cannot-match]  # P above does not take key=
        self, fn: Callable[..., Awaitable[R]], /, *, key: str, **kwargs: Any
    ) -> R: ...

    @overload
    async def atool(  # type: ignore[overload-cannot-match]  # P above does not take key=
        self, fn: Callable[..., R], /, *, key: str, **kwargs: Any
    ) -> R: ...

    async def atool(  # type: ignore[misc]  # as tool's
        self,
        fn: Callable[..., Any],
        *args: object,
        key: str | None = None,
        idempotent: bool | None = None,
        reconcile: Callable[..., Any] | None = None,
        shared: bool | None = None,
        limit: str | Sequence[str] | None = None,
        cost: float = 0,
        actual_cost: Callable[[Any], float] | None = None,
        **kwargs: Any,
    ) -> Any:
        """:meth:`tool` for an ``async def`` tool, awaited in the node's event loop, its
        arguments checked as :meth:`tool`'s; the claim, the policies and ``reconcile`` (a
        plain function) are the same. A plain function works too: its result is recorded
        as it is.

        The store's round trips (claim, record) run off the loop, in the pool slot waiting
        for the node, so a slow store never stalls the other nodes sharing the loop."""
        self._in_node("atool")
        options = Options(key, idempotent, reconcile, shared, limit, cost, actual_cost)
        return await self._tools.awaited(fn, args, kwargs, options)

    async def awaited_tools_ended(self) -> None:
        """Wait until the ``run.atool`` calls this run made on the running loop have ended
        (recorded): what the driver awaits after an async node, which may leave some
        running (``asyncio.gather`` raises at the first call that failed). The run ends
        here, on the loop, in the turn that found none running: a call a still-running task
        makes from now on is refused before its claim (its next step makes it), rather than
        claimed while the step is being committed without it."""
        await self._tools.awaited_ended()
        self._ended = True

    def wait_for_tools(self) -> None:
        """Block until the ``run.tool`` calls this run made in other threads have ended.

        A node's coroutine may hand a plain tool to a thread it stops waiting for: LangGraph
        runs a ``ToolNode``'s sync tools in the event loop's executor, and cancels the node
        when a sibling fails, which leaves the thread running. Ending the run then would let
        the next run find the call's claim pending, as if its worker had died, and run it
        again (or stop for a person) while it is still under way."""
        self._tools.wait_for_plain()
