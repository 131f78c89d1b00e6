"""One tool call from its claim in the store to its record: the machinery behind
``run.tool``/``run.atool``, which run it for a node and type its arguments."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from agentq.codec.unstorable import unserializable
from agentq.engine import aio, limits, tracing
from agentq.engine.backoff import retry_after
from agentq.engine.signatures import misfit
from agentq.engine.store_retry import RetriedCalls
from agentq.engine.tool_policy import DID_NOT_RUN, ToolPolicy, policy_of
from agentq.errors import (
    InvalidArgument,
    InvalidEffectKey,
    InvalidInput,
    LimitError,
    NeedsAttention,
    UnserializableState,
)
from agentq.ids import downstream_key, validate_effect_key
from agentq.outcomes import LimitWait
from agentq.records import ClaimOutcome, Effect
from agentq.store.contract import Store

logger = logging.getLogger("agentq")

_T = TypeVar("_T")

_UNSETTLED: Final = object()
"""``_Call.recorded`` while the call has no outcome to return yet."""


class ToolCalls:
    """The tool calls of one node run, under the run's lease; numbered in call order for
    their default keys."""

    def __init__(
        self,
        *,
        store: Store,
        calls: RetriedCalls,
        thread_id: str,
        incarnation: str | None,
        step: int,
        token: int,
        confirm_lease: Callable[[], None],
        retryable: Callable[[BaseException], bool],
        take_limits: Callable[..., limits.Held] | None,
    ) -> None:
        self.thread_id = thread_id
        self._incarnation = incarnation
        self.step = step
        self._store = store
        self._store_calls = calls
        self._token = token
        self._confirm_lease = confirm_lease
        self._retryable = retryable
        self._take_limits = take_limits
        self._calls = 0
        self._returned: dict[tuple[str, bool], _Made] = {}
        """The calls of this node run that returned, by key: another call under one of
        their keys would get their result back."""
        self._raised: dict[tuple[str, bool], str] = {}
        """The errors of this node run's calls that raised after their claim, by key: a call
        made again under one finds it pending, left by this run rather than a dead worker."""
        self._plain_running = 0
        self._plain_ended = threading.Condition()
        self._awaited_running: set[asyncio.Future[None]] = set()
        """One future per ``atool`` call under way, done when it ends (on its loop)."""
        self.limit_waits: list[dict[str, Any]] = []
        """The calls' waits for their limits, as ``run.limit_waits`` reports them."""

    def plain(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: Options,
    ) -> Any:
        """A plain function's call, made in the node's thread."""
        self._callable(fn, "tool")
        # An object with ``async def __call__`` is one too, which iscoroutinefunction
        # (3.11) does not see on the object itself.
        if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__):
            raise InvalidArgument(
                f"tool {tool_name(fn)} is a coroutine function; in an async node call it with "
                "await run.atool(...) (await agentq.langgraph.atool_call(...) in a graph)",
                thread_id=self.thread_id,
                step=self.step,
            )
        on_loop = aio.on_loop()
        if on_loop:
            aio.warn_blocking(
                f"thread {self.thread_id!r} step {self.step}: run.tool({tool_name(fn)}, ...) "
                "in an async node blocks the event loop every async node of the process "
                "shares, for the tool and the store's round trips; call await "
                "run.atool(...) (await agentq.langgraph.atool_call(...) in a graph) on an "
                "async def tool: it waits without holding the loop, and the store's round "
                "trips run off it"
            )
        call = functools.partial(
            _drive, self._effect(fn, args, kwargs, options, _inline, self._called_plain)
        )
        with self._plain_ended:
            self._plain_running += 1
        try:
            return aio.blocking_on_loop(call) if on_loop else call()
        finally:
            with self._plain_ended:
                self._plain_running -= 1
                self._plain_ended.notify_all()

    def _callable(self, fn: object, method: str) -> None:
        """Refuse a tool that is no function before anything is claimed: a model's tool
        name looked up in a dict that lacks it (``None``), or the name itself."""
        if not callable(fn):
            shown = repr(fn)
            shown = shown if len(shown) <= 80 else shown[:79] + "…"
            raise InvalidArgument(
                f"run.{method}() was given {type(fn).__name__} {shown}, not a function to "
                "call; pass the tool itself (e.g. TOOLS[call['name']]), and answer the model "
                "when it names a tool that does not exist; nothing was claimed nor run",
                thread_id=self.thread_id,
                step=self.step,
            )

    def wait_for_plain(self) -> None:
        """Block until no plain call of this run is under way in any thread."""
        with self._plain_ended:
            if self._plain_running:
                logger.info(
                    "thread %s: step %d: its node returned with %d tool call(s) still "
                    "running in other threads; the step ends once they are recorded",
                    self.thread_id,
                    self.step,
                    self._plain_running,
                )
            self._plain_ended.wait_for(lambda: self._plain_running == 0)

    async def awaited(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: Options,
    ) -> Any:
        """A call awaited in the node's event loop, the store's round trips (claim, record)
        off it, in the pool slot waiting for the node, so a slow store never stalls the
        other nodes sharing the loop."""
        self._callable(fn, "atool")
        ended = asyncio.get_running_loop().create_future()
        self._awaited_running.add(ended)
        try:
            return await self._effect(fn, args, kwargs, options, _to_its_end, _called_awaited)
        finally:
            self._awaited_running.discard(ended)
            ended.set_result(None)

    async def awaited_ended(self) -> None:
        """Wait until no ``atool`` call of this run is under way on the running loop: a
        node whose ``asyncio.gather`` raised at its first failed call returns with the
        others still running, and a step that ended without their records would leave
        their claims pending for its retry, as a dead worker's."""
        loop = asyncio.get_running_loop()
        while True:
            # Looked at again after each wait: the task a call returned to went on at once,
            # and the next call it made is waited for too.
            running = {ended for ended in self._awaited_running if ended.get_loop() is loop}
            if not running:
                return
            logger.info(
                "thread %s: step %d: its node returned with %d tool call(s) still running; "
                "the step ends once they are recorded",
                self.thread_id,
                self.step,
                len(running),
            )
            await asyncio.wait(running)

    async def _effect(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: Options,
        offload: Callable[..., Awaitable[Any]],
        invoke: Callable[..., Awaitable[Any]],
    ) -> Any:
        """One tool call from its claim to its record; ``offload`` runs the store's calls,
        ``invoke`` the tool itself.

        A claim left pending says the tool may have run, so what can stop a call before it
        starts comes before its claim or drops it: the limits are taken (and waited for)
        first, and a lease that cannot be confirmed after the claim drops it again. A
        worker killed while it waits for a limit leaves no claim behind::

            no record yet ─ take the limits (wait) ─ claim ─ confirm the lease ─ call the tool
        """
        if options.actual_cost is not None and options.limit is None:
            # Before the claim, which would otherwise be left pending.
            raise InvalidArgument(
                "actual_cost= settles a limit's tokens; name the limit with limit=",
                thread_id=self.thread_id,
                step=self.step,
            )
        if options.cost != 0 and options.limit is None:
            # Nothing would take it: the tokens the caller meant to count go uncounted.
            raise LimitError(
                f"cost={options.cost!r} is taken from a limit's tokens; name the limit with limit=",
                thread_id=self.thread_id,
                step=self.step,
            )
        with tracing.tool_span(self.thread_id, self.step, tool_name(fn), self._token) as note:
            call = self._call(fn, args, kwargs, options)
            note(call.key)  # also on a call that raises: the key is what to look it up by
            held = await offload(
                self._ready,
                call,
                fn,
                args,
                kwargs,
                options,
                undo=functools.partial(self._unready, call),
            )
            if call.recorded is not _UNSETTLED:
                if held is not None:
                    await offload(held.release)
                note(call.key, "replayed")
                self._returned[call.key, call.policy.shared] = call.made(fn, args, kwargs)
                return call.recorded
            try:
                result = await invoke(call, fn, args)
            except Exception as exc:
                # Cut short: an HTTP error's repr may carry a whole response body.
                self._raised[call.key, call.policy.shared] = _short(repr(exc))
                # One store call from here, run to its end: a cancel in between would
                # leave the claim of a call that is over.
                with _cancel_wins(call):
                    await offload(self._settle_failure, call, held, exc)
                if call.cancelled:
                    raise asyncio.CancelledError from exc
                raise
            except BaseException:
                if held is not None:
                    await offload(held.release)
                raise
            note(call.key, "called")
            with _cancel_wins(call):
                recorded = await offload(self._settle_result, call, held, result, options)
            self._returned[call.key, call.policy.shared] = call.made(fn, args, kwargs)
            if call.cancelled:
                raise asyncio.CancelledError
            return recorded

    async def _called_plain(
        self, call: _Call, fn: Callable[..., Any], args: tuple[Any, ...]
    ) -> Any:
        result = fn(*args, **call.kwargs)
        if inspect.iscoroutine(result):
            # Returned by a plain callable (a lambda around an async client): run.tool
            # cannot await it, and left alone it would be taken for the tool's unstorable
            # result, its claim left pending over a call that never happened.
            call.never_started = inspect.getcoroutinestate(result) == inspect.CORO_CREATED
            result.close()
            raise InvalidArgument(
                f"tool {call.tool} returned a coroutine, which run.tool cannot await; make "
                "the call with await run.atool(...) in an async node (await "
                "agentq.langgraph.atool_call(...) in a graph)",
                thread_id=self.thread_id,
                step=self.step,
            )
        return result

    def _call(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: Options,
    ) -> _Call:
        """The call's key, policy and arguments, numbered in call order; arguments that do
        not fit ``fn`` raise :class:`~agentq.errors.InvalidInput`."""
        declared = policy_of(fn)
        policy = ToolPolicy(
            idempotent=declared.idempotent if options.idempotent is None else options.idempotent,
            reconcile=declared.reconcile if options.reconcile is None else options.reconcile,
            shared=declared.shared if options.shared is None else options.shared,
        )
        if policy.reconcile is not None and not callable(policy.reconcile):
            # Called only once a worker died mid-call: there, it would fail the recovery
            # that needs it with a bare TypeError, every time the thread is retried.
            raise InvalidArgument(
                f"tool {tool_name(fn)}: reconcile={policy.reconcile!r} is not a function; "
                "pass reconcile=fn, where fn(idempotency_key, *args, **kwargs) returns the "
                "call's result if it happened, else agentq.DID_NOT_RUN (or idempotent=True "
                "for a tool safe to call again); nothing was claimed nor run",
                thread_id=self.thread_id,
                step=self.step,
            )
        if policy.shared and options.key is None:
            # The default key is the same in every thread: one thread's call would get
            # another's result back, and its own effect would never be made.
            raise InvalidArgument(
                f"tool {tool_name(fn)} is shared (shared=True), so its key names one record "
                f"for every thread, and the default key (step{self.step}.call"
                f"{self._calls + 1}) is the same in each; pass key= naming the effect "
                "itself (the invoice or order it is for); nothing was claimed nor run",
                thread_id=self.thread_id,
                step=self.step,
            )
        self._calls += 1
        key = options.key if options.key is not None else f"step{self.step}.call{self._calls}"
        try:
            validate_effect_key(key, None)
        except InvalidEffectKey as exc:
            # The store refuses it too, but naming neither the step nor the call.
            raise InvalidEffectKey(
                f"tool {tool_name(fn)}: {exc}", thread_id=self.thread_id, step=self.step
            ) from exc
        downstream = downstream_key(
            self._store.key_namespace,
            self.thread_id,
            key,
            shared=policy.shared,
            incarnation=self._incarnation,
        )
        # Names this call, so that a claim resent after a lost reply is known as ours.
        call = _Call(key, downstream, uuid.uuid4().hex, policy, dict(kwargs), tool_name(fn))
        call.callee = _callee(fn)
        signature = _signature(fn)
        if signature is not None:
            self._fit(fn, signature, call, downstream, args, kwargs)
        made = self._returned.get((key, policy.shared))
        if made is not None and not made.same(call.tool, args, kwargs, call.callee):
            # Its claim would answer with that call's result: this one would never run.
            if made.tool != call.tool:
                differs = "another tool"
            elif made.same(call.tool, args, kwargs, made.callee):
                differs = "another function or partial of that name"
            else:
                differs = "other arguments"
            raise InvalidArgument(
                f"key {key!r} names two different calls in this node: {made.tool} returned "
                f"under it already, and this call of {call.tool} ({differs}) would get "
                "that result back without running; give each call its own key "
                "(the model's tool-call id, or one built from what makes the call unique)",
                thread_id=self.thread_id,
                step=self.step,
            )
        return call

    def _fit(
        self,
        fn: Callable[..., Any],
        signature: inspect.Signature,
        call: _Call,
        downstream: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        """Pass ``fn`` the key and token it asks for; arguments that do not fit its
        ``signature`` raise :class:`~agentq.errors.InvalidInput`."""
        if "idempotency_key" in signature.parameters:
            call.kwargs["idempotency_key"] = downstream
        if "fencing_token" in signature.parameters:
            call.kwargs["fencing_token"] = self._token
        try:
            _takes(fn, signature).bind(*args, **call.kwargs)
        except TypeError as exc:
            # Before the claim: a call the tool cannot even take never ran, and a claim
            # left pending would stop the retried thread for a person over it.
            raise InvalidInput(
                f"tool {tool_name(fn)}{signature} cannot take these arguments "
                f"({misfit(signature, kwargs, exc)}); "
                f"nothing was claimed nor run: pass the arguments it declares (a model's "
                "tool call naming other ones can be caught as TypeError and answered)",
                thread_id=self.thread_id,
                step=self.step,
            ) from exc

    def _unrecorded(self, call: _Call) -> bool:
        """Whether the call's key has no record yet: a first call, which runs."""
        effect = self._store_calls(
            "reading a tool call's record",
            self._store.effect,
            self.thread_id,
            call.key,
            shared=call.policy.shared,
        )
        return effect is None

    def _limit(self, options: Options) -> limits.Held:
        """Take the call's limits; a wait too long for the step raises
        :class:`~agentq.outcomes.LimitWait`, so the retried step makes the call afresh."""
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
            raise
        if held.waited:
            self.limit_waits.append({"keys": list(held.keys), "waited": held.waited})
        return held

    def _ready(
        self,
        call: _Call,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: Options,
    ) -> limits.Held | None:
        """Everything before the tool: claim the call and return the limits it holds.

        A call already recorded replays and takes nothing; one left pending is settled by
        its policy first, and takes its limits only if it runs, under its claim (as does a
        shared key another thread dropped since it was read). Whatever stops the call
        after its claim drops it, which would otherwise say that a call that never
        started may have run."""
        held = None
        try:
            if options.limit is not None and self._unrecorded(call):
                held = self._limit(options)
            self._claim(call, fn, args, kwargs)
            if call.recorded is not _UNSETTLED:
                return held
            try:
                if held is None and options.limit is not None:
                    held = self._limit(options)
                # A worker paused since its claim may have been replaced meanwhile:
                # renewing the lease here, after any wait for a limit and as late as
                # possible, stops it before the effect rather than after.
                self._confirm_lease()
            except BaseException as exc:
                self._drop_claim(call, f"it was stopped before it ran: {exc!r}")
                raise
        except BaseException:
            if held is not None:
                held.release()
            raise
        return held

    def _unready(self, call: _Call, held: limits.Held | None) -> None:
        """Undo :meth:`_ready` for a call its coroutine was cancelled from before the tool
        started (LangGraph cancels the branches beside one that failed)."""
        if call.recorded is _UNSETTLED:
            self._drop_claim(call, "its coroutine was cancelled before the tool started")
        if held is not None:
            held.release()

    def _claim(
        self,
        call: _Call,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        """Claim the call's key; settle an outcome already recorded or left unknown."""
        store, thread_id, policy = self._store, self.thread_id, call.policy
        claim = self._store_calls(
            "claiming a tool call",
            store.claim_effect,
            thread_id,
            call.key,
            self._token,
            shared=policy.shared,
            claim_id=call.claim_id,
            tool=tool_name(fn),
        )
        if claim.outcome == ClaimOutcome.DONE:
            call.recorded = claim.effect.result
            return
        if claim.outcome == ClaimOutcome.UNKNOWN:
            key = call.key
            if not (policy.idempotent or policy.reconcile):
                raise self._needs_attention(call, tool_name(fn), claim.effect.token)
            taken = self._store_calls(
                "taking a tool call over",
                store.claim_effect,
                thread_id,
                key,
                self._token,
                shared=policy.shared,
                takeover=True,
                claim_id=call.claim_id,
                tool=tool_name(fn),
            )
            if taken.outcome == ClaimOutcome.DONE:
                # Recorded since the first claim (a shared key's other claimant finished
                # its call meanwhile): that outcome is the call's, and running it again
                # would end in a record refused as another driver's.
                call.recorded = taken.effect.result
                return
            if policy.reconcile is not None:
                found = policy.reconcile(call.downstream, *args, **kwargs)
                if found is not DID_NOT_RUN:
                    call.recorded = self._record(call, found)

    def _needs_attention(self, call: _Call, name: str, token: int) -> NeedsAttention:
        """What stops the thread for a person when the call's outcome is unknown: who
        claimed it, and the commands that show and settle it."""
        thread_id, key = self.thread_id, call.key
        raised = self._raised.get((key, call.policy.shared))
        if raised is not None:
            # Not a worker that died: this node's own earlier call, which raised.
            shared = " --shared" if call.policy.shared else ""
            message = (
                f"tool {name} with key {key!r} raised {raised} earlier in this step, after "
                "its claim, so whether it took effect is unknown, and it declares neither "
                "idempotent=True nor reconcile=; give a call made again after an error "
                "its own key (or declare a policy), then check whether the first one "
                f"happened and settle it: agentq resolve {thread_id} {key}{shared} "
                "--result JSON (what it did) or --did-not-run (it runs once more)"
            )
        elif not call.policy.shared:
            message = (
                f"tool {name} with key {key!r} was started by an earlier worker that "
                "died before recording its outcome, and it declares neither "
                "idempotent=True nor reconcile=; check whether it happened, then "
                f"settle it: agentq resolve {thread_id} {key} --result JSON (what "
                "it returned) or --did-not-run (it runs once more); 'agentq effects "
                f"{thread_id}' lists the thread's calls (in code: task.resolve_effect)"
            )
        else:
            # The claim's answer does not say whose it is: a shared key's holder may be
            # another thread (a fork's source, say), alive and about to record it.
            holder = self._store_calls(
                "reading a tool call's record",
                self._store.effect,
                thread_id,
                key,
                shared=True,
            )
            message = _shared_unknown(thread_id, key, name, token, holder)
        return NeedsAttention(message, thread_id=thread_id, step=self.step, key=key, tool=name)

    def _record(self, call: _Call, result: Any) -> Any:
        try:
            self._store_calls(
                "recording a tool call",
                self._store.complete_effect,
                self.thread_id,
                call.key,
                self._token,
                result,
                shared=call.policy.shared,
            )
        except UnserializableState as exc:
            raise self._unstorable(call, result, exc) from exc
        return result

    def _unstorable(
        self, call: _Call, result: Any, exc: UnserializableState
    ) -> UnserializableState:
        """The store's refusal of a result, said for the node: the step, and that the call
        ran, so its claim stays pending (a retry must not guess that it did nothing)."""
        what = f"tool {call.tool} result (key {call.key!r})"
        found = unserializable(result, what, exc.__cause__ or exc, thread_id=None, step=None)
        shared = " --shared" if call.policy.shared else ""
        if call.policy.idempotent or call.policy.reconcile:
            then = (
                "its policy settles the call when the thread runs again, once the code is "
                f"fixed: agentq retry {self.thread_id}"
            )
        else:
            then = (
                "as it ran, its outcome is left unknown: settle it once the code is fixed, "
                f"agentq resolve {self.thread_id} {call.key}{shared} --result JSON (what it "
                "returned) or --did-not-run"
            )
        return UnserializableState(
            f"{found.args[0]}; {then}",
            path=found.path,
            thread_id=self.thread_id,
            step=self.step,
        )

    def _settle_result(
        self, call: _Call, held: limits.Held | None, result: Any, options: Options
    ) -> Any:
        """Record the result and give the limits back."""
        try:
            recorded = self._record(call, result)
        finally:
            if held is not None:
                held.release()
        if held is not None and options.actual_cost is not None:
            held.settle(options.actual_cost, result)
        return recorded

    def _settle_failure(self, call: _Call, held: limits.Held | None, exc: Exception) -> None:
        """Give the limits back, after a refusal pausing them, and drop the claim of a
        call the error proves did nothing."""
        try:
            try:
                if held is not None and self._retryable(exc):
                    held.refused(exc)
            finally:
                self._failed(call, exc)
        finally:
            if held is not None:
                held.release()

    def _failed(self, call: _Call, exc: Exception) -> None:
        # Only a refusal that names when to come back proves nothing happened: retry_on
        # often lists timeouts too, and a timeout can come after the effect.
        if call.never_started or (self._retryable(exc) and retry_after(exc) is not None):
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
                shared=call.policy.shared,
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
class Options:
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
    policy: ToolPolicy
    kwargs: dict[str, Any]
    tool: str
    """The tool's name, for the errors that name the call."""
    recorded: Any = _UNSETTLED
    """The outcome already recorded (a replay) or reconciled, if any."""
    cancelled: bool = False
    """Whether the node cancelled the call while its tool ran, which then ran to its end."""
    never_started: bool = False
    """Whether the tool's call gave a coroutine, closed before it ever ran (``run.tool`` on
    a lambda around an ``async def``): nothing can have happened, so its claim goes."""
    callee: tuple[Any, ...] = ()
    """What tells the tool from another of its name (:func:`_callee`)."""

    def made(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Made:
        """The call, once it returned, with the arguments the node passed and what ``fn``
        closes over now: a tool that keeps state there (a client made on first use)
        changed it by running, and is the same call when made again."""
        return _Made(self.tool, args, kwargs, _callee(fn))


@dataclass(frozen=True)
class _Made:
    """A call of a node run that returned: its tool and arguments."""

    tool: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    callee: tuple[Any, ...] = ()
    """What tells the tool from another of its name (:func:`_callee`)."""

    def same(
        self, tool: str, args: tuple[Any, ...], kwargs: dict[str, Any], callee: tuple[Any, ...]
    ) -> bool:
        """Whether a call is this one made again (a retried branch of the node)."""
        try:
            return (
                tool == self.tool
                and bool(args == self.args)
                and bool(kwargs == self.kwargs)
                and bool(callee == self.callee)
            )
        except Exception:
            # Arguments whose == raises or is ambiguous (arrays): not a mistake to refuse
            # on a guess, so the call replays as before.
            return tool == self.tool


def _callee(fn: Callable[..., Any]) -> tuple[Any, ...]:
    """What tells ``fn`` from another tool of its name: a partial's own arguments, a
    function's code and the values it closes over. Two partials of one function (or two
    lambdas) under one key are two calls, where the name alone would make the second a
    replay of the first, its effect never made."""
    if isinstance(fn, functools.partial):
        return (_callee(fn.func), fn.args, fn.keywords)
    code = getattr(fn, "__code__", None)
    if code is None:
        return ()
    cells = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:  # a cell not yet assigned
            cells.append(None)
    return (code, tuple(cells), getattr(fn, "__defaults__", None))


async def _inline(fn: Callable[..., Any], *args: Any, undo: object = None) -> Any:
    return fn(*args)


async def _to_its_end(
    fn: Callable[..., _T], *args: Any, undo: Callable[[_T], None] | None = None
) -> _T:
    """``fn(*args)`` off the loop (:func:`aio.blocking`), run to its end even when the
    caller is cancelled meanwhile: a store call handed to the pool slot cannot be taken
    back half done, and what it did (a claim taken, a result recorded) must be kept or
    undone, not left for the next driver to guess at. On a cancel, ``undo(result)`` runs
    before the cancel goes on."""
    job = asyncio.ensure_future(aio.blocking(fn, *args))
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        await _outlasting_cancels(job)
        if undo is not None and not job.cancelled() and job.exception() is None:
            undone = asyncio.ensure_future(aio.blocking(undo, job.result()))
            await _outlasting_cancels(undone)
            if not undone.cancelled() and undone.exception() is not None:
                # Left as a crash here would leave it: the next driver settles it.
                logger.warning("could not undo %s after a cancel", fn, exc_info=undone.exception())
        raise


async def _outlasting_cancels(job: asyncio.Future[Any]) -> None:
    while not job.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({job})


@contextlib.contextmanager
def _cancel_wins(call: _Call) -> Iterator[None]:
    """A store error after a call its node cancelled ends it as cancelled, as the node
    asked (``asyncio.timeout`` turns only a cancel into its ``TimeoutError``)."""
    try:
        yield
    except Exception as exc:
        if call.cancelled:
            raise asyncio.CancelledError from exc
        raise


async def _called_awaited(call: _Call, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """The tool awaited to its end, even when the node cancels the call meanwhile (LangGraph
    cancels the branches beside one that failed, ``asyncio.wait_for`` at its timeout): cut
    off, its outcome would be unknown and the thread would stop for a person; finished, it
    is recorded (a retried step gets it back) and the cancel goes on after."""
    job = asyncio.ensure_future(_awaited_call(fn, args, call.kwargs))
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        if job.cancelled():
            raise
        call.cancelled = True
        await _outlasting_cancels(job)
        return job.result()


async def _awaited_call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Any) -> Any:
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


def _shared_unknown(thread_id: str, key: str, name: str, token: int, holder: Effect | None) -> str:
    """The needs_attention message of a shared key found claimed with no outcome: whose
    claim it is (``holder``, its record as read after the claim; ``None`` once gone)."""
    claimant = holder.claimed_by if holder is not None else None
    if holder is not None:
        token = holder.token
    tool = f", tool {holder.tool}" if holder is not None and holder.tool else ""
    settle = (
        f"settle it: agentq resolve {thread_id} {key} --shared --result JSON (what it "
        "returned) or --did-not-run (it runs once more)"
    )
    if claimant == thread_id:
        by = f"an earlier worker of this thread (token {token}{tool}) that died before recording it"
        then = f"Check whether the call happened, then {settle}"
    else:
        who = f"thread {claimant!r}" if claimant else "another thread or an earlier run of this one"
        by = (
            f"{who} (token {token}{tool}), which may still be running the call or may have "
            "died before recording it"
        )
        then = (
            f"If {who if claimant else 'that one'} still runs, wait until it records the "
            f"outcome, then run this thread on: agentq retry {thread_id}. If not, check "
            f"whether the call happened, then {settle}"
        )
    return (
        f"tool {name} uses the shared key {key!r} (shared=True) and found it claimed, with no "
        f"outcome recorded, by {by}; {name} declares neither idempotent=True nor reconcile=. "
        f"{then}; 'agentq effects {thread_id} --shared {key}' shows the record (in code: "
        "task.resolve_effect(..., shared=True))"
    )


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    """``fn``'s signature, or ``None`` for a callable that has none to read (a C function
    without a text signature, such as ``time.time`` or ``max``, or an
    ``operator.methodcaller``): a tool still, called with what the node passes, its
    arguments checked by the call itself."""
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _takes(fn: Callable[..., Any], signature: inspect.Signature) -> inspect.Signature:
    """The signature ``fn``'s arguments must fit. ``inspect.signature`` follows
    ``__wrapped__`` to the function a decorator wraps, which may take an argument the
    wrapper supplies itself (a client, a session): the wrapper's own one is what the
    call meets, and a call it takes is not refused on the inner function's say."""
    if getattr(fn, "__wrapped__", None) is None:
        return signature
    try:
        return inspect.signature(fn, follow_wrapped=False)
    except (TypeError, ValueError):
        return signature


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def tool_name(fn: Callable[..., Any]) -> str:
    """The name a tool's record and errors show: stable across processes, where a
    callable object's repr carries its memory address."""
    name = getattr(fn, "__qualname__", None)
    if isinstance(name, str):
        return name
    if isinstance(fn, functools.partial):
        return tool_name(fn.func)
    return type(fn).__qualname__
