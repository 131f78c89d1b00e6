"""``AgentTask``: a Celery task whose body is a durable graph of named nodes."""

from __future__ import annotations

import datetime
import inspect
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, Final, Never, TypeVar

import kombu.exceptions
from celery import Task
from celery.backends.base import DisabledBackend
from celery.backends.rpc import RPCBackend
from celery.exceptions import Ignore, SoftTimeLimitExceeded
from celery.result import AsyncResult
from celery.utils import uuid
from celery.utils.time import maybe_iso8601, maybe_make_aware
from kombu.utils.functional import retry_over_time

from agentq.celery import canvas, task_outcome
from agentq.celery.drain import draining
from agentq.celery.runtime import WORKER_STEP, Runtime, runtime_of
from agentq.engine import tracing
from agentq.engine.driver import Driver
from agentq.engine.signatures import misfit
from agentq.engine.store_retry import RetriedCalls
from agentq.engine.thread_keys import KeySeat, give_back
from agentq.errors import (
    InvalidArgument,
    InvalidInput,
    LimitError,
    MessageNotSent,
    StoreUnavailable,
    ThreadNotFound,
    ThreadStopped,
    WaitTimeout,
)
from agentq.ids import validate_thread_id
from agentq.records import FINISHED, Status, ThreadMeta
from agentq.store.contract import UNSET

logger = logging.getLogger("agentq")

T = TypeVar("T")

ROUTING_OPTIONS = ("queue", "exchange", "routing_key", "priority")
"""The ``apply_async`` options a thread keeps for every later send: where its messages
go, given in the call or by the task class (``Task.queue``, ...). One-shot options
(``countdown``, ``eta``, ``expires``, ``task_id``, ...) apply to one message."""


STORED_HEADER: Final = "agentq_stored"
"""The message header saying that its sender saw the thread in the store: a worker that
finds no such thread knows it was deleted since (a late or duplicated message) and drops
the message rather than start the thread again from nothing and repeat its tools."""


KEY_HEADER: Final = "agentq_concurrency_key"
"""Where a thread's concurrency key is kept: in the headers of its stored send options, so
every later send (recovery, hand-over, resume) and every worker sees the first one."""


ORIGIN_HEADER: Final = "agentq_origin"
"""The header of a later message of a thread (a wake, recovery's, a hand-over's) naming
the thread's first task, whose revoke the worker looks for (:data:`FIRST_REVOKED`). A
person's resume, retry or settle marks the thread ``reopened`` in the store: that
decision, made since, outranks the revoke for every message after it."""


FIRST_REVOKED: Final = "agentq_first_revoked"
"""Set in a message's request by the worker's main process, which revoke broadcasts
reach (a prefork child keeps the revoked set it forked with), when the thread's first
task is in the worker's revoked set: the driver cancels a thread that has committed no
step and that no person sent on since (``ThreadMeta.reopened``)."""


_RETRY_TIMING: Final = ("max_retries", "interval_start", "interval_step", "interval_max")
"""The keys of a Celery ``retry_policy`` that say how often and how long to try again."""


def key_sent_with(meta: ThreadMeta) -> str | None:
    """The concurrency key ``apply_async`` kept with the thread, if it kept one."""
    key = (meta.options.get("headers") or {}).get(KEY_HEADER)
    return key if isinstance(key, str) else None


def _stored(options: dict[str, Any], origin: str | None = None) -> dict[str, Any]:
    """``options`` with the headers of a message of a thread the store holds, and
    ``origin`` as its :data:`ORIGIN_HEADER` if given."""
    headers = {**(options.get("headers") or {}), STORED_HEADER: True}
    if origin is not None:
        headers[ORIGIN_HEADER] = origin
    return {**options, "headers": headers}


def _start_delay(options: dict[str, Any]) -> float:
    """Seconds until a worker runs the message, as Celery reads its options: the
    ``countdown`` if given, else the ``eta`` (a datetime or an ISO 8601 string; naive is
    UTC). Recovery leaves the thread alone until then."""
    if options.get("countdown"):
        return float(options["countdown"])
    eta: datetime.datetime | None = maybe_iso8601(options.get("eta"))
    if eta is None:
        return 0.0
    at: datetime.datetime = maybe_make_aware(eta)
    return max(0.0, (at - datetime.datetime.now(datetime.UTC)).total_seconds())


KEPT_FLAGS = ("ignore_result",)
"""The ``apply_async`` flags a thread keeps for every later send too: a message's
``ignore_result`` holds for the thread, whose later tasks would otherwise store their
results, and the thread's under the first task's id, which its caller asked not to keep."""


KEPT_LIMITS = ("time_limit", "soft_time_limit")
"""The per-call time limits a thread keeps for every later send: each message runs a part
of the thread, and a hand-over or a resume must not run the rest without the limits its
caller set. The task class's own apply on every worker anyway, as they do now."""


def _kept(options: dict[str, Any], by_class: dict[str, Any]) -> dict[str, Any]:
    """What a thread keeps of its first ``apply_async`` options (and of its task class's
    routing, ``by_class``) for every later send. The class's routing is kept too: a
    process without the agent's class (``agentq -A proj resume`` where the agents load
    through ``include``) sends the thread by name, and Celery would route it to the
    default queue, where no worker for it may listen."""
    kept: dict[str, Any] = {}
    for name in ROUTING_OPTIONS:
        value = options.get(name)
        if value is None:
            value = by_class.get(name)
        # A kombu Queue or Exchange object is kept by name, as Celery routes by name.
        value = value if isinstance(value, (str, int)) else getattr(value, "name", None)
        if value is not None:
            kept[name] = value
    for name in KEPT_FLAGS:
        if isinstance(options.get(name), bool):
            kept[name] = options[name]
    for name in KEPT_LIMITS:
        limit = options.get(name)
        if isinstance(limit, (int, float)) and not isinstance(limit, bool):
            kept[name] = limit
    return kept


def _with_headers(kept: dict[str, Any], sent: dict[str, Any]) -> dict[str, Any]:
    """``kept`` options with the ``headers`` of ``sent`` added to their own: a header
    given for one send adds to the thread's (its caller's custom headers, trace context
    and concurrency key) rather than drop them from that message."""
    merged = {**kept, **sent}
    headers = {**(kept.get("headers") or {}), **(sent.get("headers") or {})}
    if headers:
        merged["headers"] = headers
    else:
        merged.pop("headers", None)
    return merged


def refuse_autoretry(name: str) -> Never:
    """Celery's retry would come after the thread failed, and send the task again."""
    raise InvalidArgument(
        f"agent {name} sets autoretry_for; an agent retries a failing step itself, keeping "
        "its progress: list the errors in retry_on instead (the delay follows their "
        "Retry-After or backoff_base, up to max_attempts, set in init_app)"
    )


def refuse_autoretry_at_start(app: Any) -> None:
    """Refuse the agents registered with ``app.register_task(agent, autoretry_for=...)``,
    which no class sees: Celery wraps their ``run`` (keeping it as ``_orig_run``)."""
    for task in app.tasks.values():
        if isinstance(task, AgentTask) and hasattr(task, "_orig_run"):
            refuse_autoretry(task.name)


class AgentTask(Task):  # type: ignore[misc]
    """Subclass it, give it a ``name`` and nodes, register it with ``app.register_task``.

    A node is a method ``node(self, run)`` returning the next node's name, ``Done(result)``
    or ``Interrupt(payload, resume_at=...)``. The first node, ``start`` unless
    ``entry_node`` says otherwise, also receives the keyword arguments given to ``delay``.
    After every node the thread's state is committed as one checkpoint; a worker that dies
    loses at most the node in flight, and the thread resumes from its latest checkpoint.

    ``agent.delay(thread_id, **input)`` starts (or re-sends) a thread: the thread id is its
    identity, so sending it twice never runs it twice.
    """

    entry_node: ClassVar[str] = "start"
    retry_on: ClassVar[tuple[type[BaseException], ...]] = ()
    """Exceptions (rate limits, overloaded providers) that retry the step after a delay."""
    append_only: ClassVar[tuple[str, ...]] = ()
    """State fields (lists) that only ever grow, like the message history: each step
    stores just the items it appended, so a step costs the same at message 10 and 1000.
    Changing an item once it is committed fails the thread with AppendOnlyViolation."""

    concurrency_key: ClassVar[str | None] = None
    """The key whose declared ``threads=N`` caps how many of this agent's threads run at
    once (``"tenant:42"`` for ``agentq.limit("tenant:{tenant_id}", threads=2)``).
    ``apply_async(..., concurrency_key=...)`` sets it per thread, and
    :meth:`concurrency_key_of` may derive it from the input. Threads over the cap wait
    in the store, in arrival order, holding no worker slot."""

    acks_late = True
    reject_on_worker_lost = True
    Request = "agentq.celery.request:AgentRequest"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if getattr(cls, "autoretry_for", ()):
            refuse_autoretry(getattr(cls, "name", None) or cls.__name__)

    @classmethod
    def on_bound(cls, app: Any) -> None:
        """Give the app's workers agentq's bootstep (recovery, the deploy hand-over, the
        store's check) even when ``app.conf.agentq_*`` configures it without
        ``init_app``: the settings are read when the worker starts, but the step must be
        there before, or nothing would ever send a thread whose message was lost."""
        app.steps["worker"].add(WORKER_STEP)

    @property
    def agentq(self) -> Runtime:
        return runtime_of(self.app)

    def retry(self, *args: Any, **kwargs: Any) -> Never:
        """Refused: an agent retries a failing step, not the task (see :attr:`retry_on`)."""
        request_args = self.request.args or ()
        thread_id = request_args[0] if request_args and isinstance(request_args[0], str) else None
        raise InvalidArgument(
            "Task.retry() would send the whole task again after its thread failed; an agent "
            "retries a failing step itself, keeping its progress: raise the error and list "
            "its class in retry_on (the delay follows its Retry-After or backoff_base, up to "
            "max_attempts, set in init_app)",
            thread_id=thread_id,
        )

    def find_node(self, name: str) -> Callable[..., Any] | None:
        """The node ``name``: a public method of the agent's own class. One this class
        and Celery's ``Task`` define (``wait``, ``delay``, ``run``, ``apply``) is none,
        unless the agent overrides it: called with a run, it would fail far from the
        misnamed node, or run the task again inside the step."""
        if not isinstance(name, str) or not name or name.startswith("_"):
            return None
        defined = getattr(type(self), name, None)
        if defined is None or defined is getattr(AgentTask, name, None):
            return None
        node = getattr(self, name)
        return node if callable(node) else None

    def _store_call(
        self, what: str, thread_id: str, call: Callable[..., T], *args: Any, **kwargs: Any
    ) -> T:
        """``call(*args, **kwargs)`` on the store, an unreachable store raised as
        :class:`~agentq.errors.StoreUnavailable` with the client's error as its cause."""
        store = self.agentq.store
        try:
            return call(*args, **kwargs)
        except Exception as exc:
            if not store.is_transient(exc):
                raise
            raise StoreUnavailable(
                f"cannot reach the store while {what} ({type(exc).__name__}: {exc}); check "
                "that it is up and try again: the same thread id never runs twice",
                thread_id=thread_id,
            ) from exc

    # -- the Celery side ---------------------------------------------------------------------

    def run(self, thread_id: str) -> Any:
        """Drive the thread, then end in the Celery state that says what became of it
        (see :mod:`agentq.celery.task_outcome`)."""
        validate_thread_id(thread_id)
        runtime = self.agentq
        stored = bool(getattr(self.request, STORED_HEADER, False))
        driver = Driver(
            self,
            thread_id,
            runtime.store,
            runtime.settings,
            draining.is_set,
            may_open=not stored,
            seat_of=self._seat_of,
            first_revoked=bool(getattr(self.request, FIRST_REVOKED, False)),
            interruptions=(SoftTimeLimitExceeded,),
        )
        calls = RetriedCalls(runtime.store, thread_id, runtime.settings.lease_ttl)
        try:
            driver.drive()
            meta = driver.ended or calls("reading the thread", runtime.store.meta, thread_id)
        except Exception as exc:
            if driver.store_unreachable(exc):
                task_outcome.given_back(self, thread_id, exc, driver.requeued)
            meta = self._meta_after_failure(calls, thread_id, exc)
            if meta is not None and meta.status == Status.NEEDS_ATTENTION:
                # Stopped for a person (a checkpoint the store lost): not the task's failure.
                return task_outcome.finish(self, meta, None, None)
            task_outcome.failed(self, meta, exc)
            raise
        if meta is None:  # deleted: the driver dropped the message
            raise Ignore()
        return task_outcome.finish(self, meta, driver.retrying, driver.waiting_for)

    def _meta_after_failure(
        self, calls: RetriedCalls, thread_id: str, exc: Exception
    ) -> ThreadMeta | None:
        """The thread's meta after its run raised ``exc``; ``None`` if the store stays out
        for longer than the read can wait, so that the task fails with ``exc``, the
        error its thread failed with, rather than with the store's."""
        store = self.agentq.store
        try:
            return calls("reading the thread", store.meta, thread_id)
        except Exception as read_error:
            if not store.is_transient(read_error):
                raise
            logger.warning(
                "thread %s: failed with %s: %s; the store stayed unreachable after it (%s: "
                "%s), so the thread's first task does not hold the error",
                thread_id,
                type(exc).__name__,
                exc,
                type(read_error).__name__,
                read_error,
            )
            return None

    def delay(self, thread_id: str, /, *misplaced: Never, **input: Any) -> AsyncResult:
        """Start (or re-send) thread ``thread_id``, ``input`` being the entry node's
        keyword arguments: ``apply_async((thread_id,), input)``. Input given by position
        is refused, by the type checker and with :class:`~agentq.errors.InvalidArgument`."""
        return self.apply_async((thread_id, *misplaced), input)

    def apply_async(
        self,
        args: tuple[str, ...] | list[str] | None = None,
        kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> AsyncResult:
        """Start thread ``args[0]`` with ``kwargs`` as the entry node's input (kept in the
        store, not the message) and send it with the usual Celery ``options``. Its routing
        options (``queue``, ``exchange``, ``routing_key``, ``priority``) and
        ``ignore_result`` are kept too, so recovery, hand-overs and resumes send it the
        same way, and so is its
        ``concurrency_key`` (else :attr:`concurrency_key`'s), and its canvas (``link``,
        ``link_error``, the chain or chord it is in), which the task that ends the thread
        carries on. An existing thread keeps its first input and options and is only
        re-sent, as :meth:`resend` sends it; the result returned then is its first task's,
        which holds the thread's end whichever task ends it, while the thread runs on and
        the backend keeps results (else the message's own, as when ``task_id`` is
        given)."""
        if not args or len(args) != 1:
            raise InvalidArgument(
                f"{self.name} takes exactly one positional argument, the thread id (got "
                f"{len(args or ())}); pass the agent's input as keyword arguments"
            )
        thread_id = validate_thread_id(args[0])
        self._check_input(thread_id, kwargs or {})
        key = self._key_for(thread_id, kwargs or {}, options.pop("concurrency_key", None))
        # Chosen here so that the thread remembers it: the result stored under it is the
        # thread's, whichever task finishes the thread.
        chose_id = "task_id" in options
        task_id = options.setdefault("task_id", uuid())
        # The caller's trace context, kept with the thread: every later send carries it.
        headers = {**(options.get("headers") or {}), **tracing.sending_headers()}
        if key:
            headers[KEY_HEADER] = key
        kept = _kept(options, self._get_exec_options())
        if headers:
            kept["headers"] = headers
        meta, created = self._open(
            thread_id,
            options,
            task=self.name,
            node=self.entry_node,
            input=dict(kwargs) if kwargs else None,
            start_grace=self._grace(options),
            options=kept,
            origin=task_id,
            canvas=canvas.captured(options, options.get("serializer") or self.serializer),
        )
        if not created:
            sent = _sent_or_told(meta, lambda: self.resend(meta, **options))
            # A message finding its thread ended stores that end as its own; without a
            # backend keeping results, the first task's end goes to its caller if anywhere.
            if (
                chose_id
                or meta.origin is None
                or meta.status in FINISHED
                or self.ignore_result
                or meta.options.get("ignore_result")
                or isinstance(self.backend, (DisabledBackend, RPCBackend))
            ):
                return sent
            # The thread's result, as for its first delay(): the message just sent only
            # nudges a thread that runs on, and ends WAITING or HANDED_OVER, never to be
            # ended later; the task that ends the thread stores its end under this id.
            return self.AsyncResult(meta.origin)
        stored = _stored(_with_headers(kept, options))
        return _sent_or_told(
            meta, lambda: super(AgentTask, self).apply_async((thread_id,), None, **stored)
        )

    def _open(
        self, thread_id: str, sending: dict[str, Any], /, **opening: Any
    ) -> tuple[ThreadMeta, bool]:
        """Open the thread in the store, trying again through a store error as Celery
        tries a publish again through a broker error: under the ``retry`` and
        ``retry_policy`` of ``sending`` (else ``task_publish_retry`` and
        ``task_publish_retry_policy``). Opening is safe to repeat: a thread that exists
        is left as it is. Returns what :meth:`Store.open_thread` does."""
        conf = self.app.conf
        store = self.agentq.store
        what = ("starting the thread", thread_id, store.open_thread, thread_id)
        opened: tuple[ThreadMeta, bool]
        if not sending.get("retry", conf.task_publish_retry):
            opened = self._store_call(*what, **opening)
            return opened
        given = {**conf.task_publish_retry_policy, **(sending.get("retry_policy") or {})}
        # Its timing only: retry_errors name the broker's errors, not the store's.
        policy = {name: given[name] for name in _RETRY_TIMING if name in given}

        def wait(exc: BaseException, intervals: Iterator[float], retries: int) -> float:
            pause = next(intervals)
            logger.warning("thread %s: %s; trying again in %.1f s", thread_id, exc, pause)
            return pause

        opened = retry_over_time(  # type: ignore[no-untyped-call]
            self._store_call, StoreUnavailable, what, opening, errback=wait, **policy
        )
        return opened

    def _key_for(self, thread_id: str, input: dict[str, Any], given: str | None) -> str | None:
        """The thread's concurrency key (``given``, else :attr:`concurrency_key`'s),
        checked against the declared limits here, in the caller, like its input."""
        key = given if given is not None else self.concurrency_key_of(thread_id, input)
        if key is not None:
            try:
                self.agentq.settings.declared_limits.thread_cap(key)
            except LimitError as exc:
                raise LimitError(f"thread {thread_id}: {exc}") from None
        return key

    def _seat_of(self, meta: ThreadMeta) -> KeySeat | None:
        """The concurrency key the thread was sent with, and its cap as declared now
        (none if its declaration is gone)."""
        key = key_sent_with(meta)
        if key is None:  # sent by name, without apply_async's header
            key = self.concurrency_key_of(meta.thread_id, meta.input or {})
        if key is None:
            return None
        settings = self.agentq.settings
        try:
            cap = settings.declared_limits.thread_cap(key)
        except LimitError as exc:
            # Sent while the key was declared (apply_async checked it): the cap was
            # dropped since. Failing here would leave the thread running until its lease
            # ran out, again at every re-send; the declarations say it has no cap now.
            logger.error("thread %s: %s; it runs without a cap", meta.thread_id, exc)
            return None
        return KeySeat(key, cap, settings.start_grace, self._wake)

    def _wake(self, thread_ids: Sequence[str]) -> None:
        """Send the threads a freed slot lets start; one that cannot be sent now is due
        in a start grace, when recovery sends it."""
        store = self.agentq.store
        for thread_id in thread_ids:
            try:
                meta = store.meta(thread_id)
                if meta is not None:
                    resend_thread(self.app, meta)
            except Exception:
                logger.warning(
                    "thread %s: woken for its concurrency key but not sent; recovery sends it",
                    thread_id,
                    exc_info=True,
                )

    _entry_seen: tuple[object, inspect.Signature] | None = None
    """The entry node's function and its signature, as :meth:`_entry_signature` last
    read them."""

    def _entry_signature(self) -> inspect.Signature | None:
        """The entry node's signature, read again only when the node is another function:
        ``inspect.signature`` took 40-60 µs of every ``delay()``, and a function agent's
        nodes are added (or redefined) after the agent is registered."""
        node = getattr(self, self.entry_node, None)
        if not callable(node):
            return None
        function = getattr(node, "__func__", node)
        seen = self._entry_seen
        if seen is None or seen[0] is not function:
            seen = self._entry_seen = (function, inspect.signature(node))
        return seen[1]

    def _check_input(self, thread_id: str, input: dict[str, Any]) -> None:
        """Bind ``input`` to the entry node's signature here, in the caller, as Celery's
        ``typing`` option does for a plain task's arguments: a misspelt keyword fails at
        once instead of as a failed thread on a worker. No input at all is not checked:
        it re-sends a thread that exists, which keeps its first input."""
        if not input or not self.typing:
            return
        signature = self._entry_signature()
        if signature is None:
            return  # an agent without its entry node fails on the worker, naming it
        try:
            signature.bind(None, **input)
        except TypeError as exc:
            raise InvalidInput(
                f"{self.name}.{self.entry_node}{signature} cannot take this input: "
                f"{misfit(signature, input, exc)}; give delay() the keyword arguments after "
                "run",
                thread_id=thread_id,
            ) from exc

    def enqueue(self, thread_id: str, **options: Any) -> AsyncResult:
        """Send a message for a thread the store already holds, routed as it was first
        sent unless ``options`` say otherwise."""
        meta = self._store_call(
            "reading the thread", thread_id, self.agentq.store.meta, validate_thread_id(thread_id)
        )
        if meta is None:
            return super().apply_async((thread_id,), None, **options)
        return self.resend(meta, **options)

    def resend(self, meta: ThreadMeta, **options: Any) -> AsyncResult:
        """:meth:`enqueue` for a caller that holds the thread's meta already."""
        sent = _stored(_with_headers(meta.options, options), meta.origin)
        # Not the class's expires, which Celery would give every message: a later message
        # that expires is only dropped, and recovery's next one, expiring the same way
        # under a backlog, would leave the thread queued for as long as it lasts.
        return super().apply_async((meta.thread_id,), None, **{"expires": None, **sent})

    # -- hooks -------------------------------------------------------------------------------

    def should_retry(self, exc: BaseException) -> bool:
        """Whether ``exc`` retries the step; by default, when it is one of ``retry_on``."""
        return isinstance(exc, self.retry_on)

    def concurrency_key_of(self, thread_id: str, input: dict[str, Any]) -> str | None:
        """The concurrency key of a thread sent without one; by default
        :attr:`concurrency_key`. Override it to key threads by their input, e.g.
        ``return f"tenant:{input['tenant_id']}"``."""
        return self.concurrency_key

    def on_step(
        self,
        thread_id: str,
        step: int,
        node: str,
        next_node: str | None,
        *,
        limit_waits: Sequence[dict[str, Any]] = (),
    ) -> None:
        """Called after each committed step: reports progress to Celery and Flower, with
        the step's waits for its limits (``keys`` and ``waited`` seconds)."""
        logger.info(
            "thread %s: step %d (%s) committed, next %s", thread_id, step, node, next_node or "-"
        )
        fields = {"thread_id": thread_id, "step": step, "node": node, "next": next_node}
        stores, sends = task_outcome.progress_reports(self)
        if stores:
            self.update_state(state="PROGRESS", meta=fields)
        if sends:
            self.send_event("task-progress", **fields, limit_waits=list(limit_waits))

    def on_limit_wait(
        self, thread_id: str, step: int, node: str, limit_waits: Sequence[dict[str, Any]]
    ) -> None:
        """Called when a step ends to wait for its limits: a ``task-progress`` event says
        which keys it waits for and when it is due (``due_at``); ``node`` runs again then."""
        if self.app.conf.worker_send_task_events and self.request.hostname:
            fields = {"thread_id": thread_id, "step": step, "node": node, "next": node}
            self.send_event("task-progress", **fields, limit_waits=list(limit_waits))

    # -- controlling a thread from outside -----------------------------------------------------

    def thread(self, thread_id: str) -> ThreadMeta:
        """The thread's meta: status, step, node, result, error, interrupt payload."""
        meta = self._store_call(
            "reading the thread", thread_id, self.agentq.store.meta, validate_thread_id(thread_id)
        )
        if meta is None:
            raise ThreadNotFound("no such thread; start it with .delay()", thread_id=thread_id)
        return meta

    def resume(self, thread_id: str, value: Any = None, **options: Any) -> AsyncResult:
        """Continue a ``waiting`` thread: ``value`` becomes ``run.resume_value`` (and what
        ``run.interrupt()`` returns). A thread that failed in the node given the previous
        answer is resumed with this one instead.

        The thread is queued in the store, then its message is sent; when that send
        fails, :class:`~agentq.errors.MessageNotSent` says the thread stays queued (a
        worker's sweeper sends it in ``start_grace``), as for :meth:`retry_thread` and
        :meth:`resolve_effect`."""
        meta = self._store_call(
            "resuming the thread",
            thread_id,
            self.agentq.store.reopen,
            validate_thread_id(thread_id),
            from_statuses=self.thread(thread_id).resumable_from,
            resume_value=value,
            start_grace=self._grace(options),
        )
        return self._send_reopened(meta, options)

    def retry_thread(self, thread_id: str, **options: Any) -> AsyncResult:
        """Run a ``failed`` or ``needs_attention`` thread again from its latest checkpoint
        (after fixing what stopped it; a call whose outcome is unknown is settled with
        :meth:`resolve_effect` instead). Named so because ``Task.retry`` is Celery's."""
        meta = self._store_call(
            "retrying the thread",
            thread_id,
            self.agentq.store.reopen,
            validate_thread_id(thread_id),
            from_statuses={Status.FAILED, Status.NEEDS_ATTENTION},
            start_grace=self._grace(options),
        )
        return self._send_reopened(meta, options)

    def resolve_effect(
        self,
        thread_id: str,
        key: str,
        *,
        result: Any = UNSET,
        did_not_run: bool = False,
        shared: bool = False,
        **options: Any,
    ) -> AsyncResult:
        """Settle tool call ``key`` of a ``needs_attention`` (or ``failed``) thread once you
        checked what it did, and run the thread on from its latest checkpoint: with
        ``result`` the node gets it back as the tool's result without calling the tool;
        with ``did_not_run=True`` the tool runs, once. ``shared=True`` settles the shared
        record of a tool declared ``shared=True`` (which every thread using the key finds).
        Refused while a worker holds the thread, or the thread that claimed a shared key;
        see :meth:`~agentq.store.contract.Store.resolve_effect`."""
        meta = self._store_call(
            "settling a tool call",
            thread_id,
            self.agentq.store.resolve_effect,
            validate_thread_id(thread_id),
            key,
            result=result,
            did_not_run=did_not_run,
            start_grace=self._grace(options),
            shared=shared,
        )
        return self._send_reopened(meta, options)

    def _grace(self, options: dict[str, Any]) -> float:
        """Seconds a thread sent on with ``options`` waits for its message before recovery
        sends another: a start grace past its ``countdown`` or ``eta``, as for a first
        message, or recovery would run it before the time its caller chose."""
        return _start_delay(options) + self.agentq.settings.start_grace

    def _send_reopened(self, meta: ThreadMeta, options: dict[str, Any]) -> AsyncResult:
        return send_reopened(meta, self._grace(options), lambda: self.resend(meta, **options))

    def cancel(self, thread_id: str) -> Status:
        """Cancel the thread: at once if idle, at the next step boundary if running."""
        status = self._store_call(
            "cancelling the thread",
            thread_id,
            self.agentq.store.request_cancel,
            validate_thread_id(thread_id),
        )
        if status == Status.CANCELLED:  # no task runs to say so: the first one is revoked
            meta = self.thread(thread_id)
            task_outcome.cancelled(self, meta)
            if seat := self._seat_of(meta):  # a slot reserved for it starts the next now
                self._store_call(
                    "waking its key", thread_id, give_back, self.agentq.store, meta, seat
                )
        return status

    def wait(self, thread_id: str, timeout: float | None = None, interval: float = 0.1) -> Any:
        """Block until the thread is done and return its result, whichever workers ran it.

        Raises :class:`~agentq.errors.ThreadStopped` if it ends otherwise (failed,
        cancelled, waiting for a human, needing attention) and
        :class:`~agentq.errors.WaitTimeout` after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            meta = self.thread(thread_id)
            if meta.status == Status.DONE:
                return meta.result
            if meta.status.is_idle:
                raise ThreadStopped(
                    f"thread is {meta.status.value}"
                    + (f": {meta.error.splitlines()[0]}" if meta.error else ""),
                    thread_id=thread_id,
                    status=meta.status.value,
                    error=meta.error,
                )
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"not finished after {timeout} s (status {meta.status.value}, step "
                    f"{meta.step}); wait longer or check the workers",
                    thread_id=thread_id,
                )
            time.sleep(interval)


def resend_thread(app: Any, meta: ThreadMeta) -> Any:
    """Send a message for a thread the store holds, routed as it was first sent: through
    its task when this process has it, else by name (the task lives in the workers' code)."""
    task = app.tasks.get(meta.task)
    if isinstance(task, AgentTask):
        return task.resend(meta)
    return app.send_task(meta.task, args=(meta.thread_id,), **_stored(meta.options, meta.origin))


def _sent_or_told(meta: ThreadMeta, send: Callable[[], T]) -> T:
    """``send()`` the message of a thread ``delay`` stored or found. A thread that runs by
    itself runs whatever the broker does (a worker's sweeper sends it when it is due), so a
    failed send raises :class:`~agentq.errors.MessageNotSent`, which says so: the broker's
    bare error reads as "nothing will run", and a caller who sent the work another way
    would have it done twice."""
    try:
        return send()
    except (kombu.exceptions.OperationalError, ConnectionError) as exc:
        # The broker out of reach, as later sends may not be; an error of the message
        # itself (a queue that does not exist) would stop the sweeper's sends too.
        if not meta.runs_by_itself:
            raise
        raise MessageNotSent(
            f"stored ({meta.status.value}), but its message was not sent "
            f"({type(exc).__name__}: {exc}); it is not lost: a worker's sweeper sends it when "
            "it is due, once the broker is reachable. Sending it again with delay() is safe: "
            "it is the same thread, not a second one",
            thread_id=meta.thread_id,
            status=meta.status.value,
        ) from exc


def send_reopened(meta: ThreadMeta, start_grace: float, send: Callable[[], T]) -> T:
    """``send()`` the message of a thread a person just queued again (resumed, retried,
    an effect settled) in ``start_grace`` seconds. The store's change stands whatever the
    broker does, and asking again is refused now that the thread is queued, so a failed
    send raises :class:`~agentq.errors.MessageNotSent`, which says so, not the broker's
    bare error: read as a failed resume, that error would have the operator ask again."""
    try:
        return send()
    except Exception as exc:  # whatever stopped the send, the thread is queued
        raise MessageNotSent(
            f"queued again, but its message was not sent ({type(exc).__name__}: {exc}); it "
            f"is not lost: a worker's sweeper sends it when it is due, in {start_grace:g} s "
            "(start_grace), once the broker is reachable. Do not ask again: the thread is "
            "queued now, and a resume, retry or settle of it is refused",
            thread_id=meta.thread_id,
            status=meta.status.value,
        ) from exc
