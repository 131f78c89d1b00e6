"""How a task run ends in Celery's terms: its state, its events, and the result the caller
of ``delay()`` waits for, all saying what became of the thread.

A task that leaves its thread unfinished does not succeed with ``None``: it ends
``WAITING`` (for a human), ``WAITING_FOR_KEY`` (for a slot of its concurrency key),
``RETRY`` (Celery's own, so ``on_retry`` and ``task-retried`` fire; the thread is due again
later), ``HANDED_OVER`` (another task carries the thread on, a store outage included) or
``NEEDS_ATTENTION``. The states with a thread id in their meta are not ready, so
``AsyncResult.get()`` keeps waiting; the task that ends the thread stores its result (or
error, or revocation) under the thread's first task id too, where ``get()`` finds it, and
carries on the first task's callbacks, chain and chord (:mod:`agentq.celery.canvas`).
"""

from __future__ import annotations

import datetime
import functools
import logging
import uuid
from collections.abc import Callable
from typing import Any, Final, NoReturn

from celery import Task, states
from celery.app.task import Context, get_actual_ignore_result
from celery.backends.base import DisabledBackend
from celery.backends.rpc import RPCBackend
from celery.exceptions import Ignore, Retry

from agentq.celery import canvas
from agentq.engine.store_retry import RetriedCalls
from agentq.engine.thread_keys import KeyWait
from agentq.errors import ThreadStopped
from agentq.records import Status, ThreadMeta

logger = logging.getLogger("agentq")

WAITING: Final = "WAITING"
"""The thread waits for a human (``run.interrupt``); meta holds the interrupt payload and
``timeout_at``, the Unix time the wait times out (``None`` without a timeout)."""
HANDED_OVER: Final = "HANDED_OVER"
"""Another task carries the thread on: this worker stopped (a warm shutdown) or gave it
back, or another worker already drives it."""
WAITING_FOR_KEY: Final = "WAITING_FOR_KEY"
"""The thread waits, parked in the store, for a slot of its concurrency key; meta holds
the key and the thread's position in its queue. The thread that frees a slot sends it."""
NEEDS_ATTENTION: Final = "NEEDS_ATTENTION"
"""The thread stopped for a person (a tool call whose outcome nobody knows, a lost
checkpoint); meta holds the error. ``agentq effects`` and ``agentq resolve`` settle it."""

_EVENTS: Final = {
    Status.WAITING: ("task-waiting", WAITING),
    Status.QUEUED: ("task-handed-over", HANDED_OVER),
    Status.RUNNING: ("task-handed-over", HANDED_OVER),
    Status.NEEDS_ATTENTION: ("task-needs-attention", NEEDS_ATTENTION),
}
_PROGRESS_REPORTS: Final = "agentq_progress_reports"
"""Where :func:`progress_reports` keeps its answer on the run's request."""


def finish(
    task: Task,
    meta: ThreadMeta,
    retrying: tuple[Exception, float] | None,
    waiting_for: KeyWait | None = None,
) -> Any:
    """The task's return value if the thread is done; else raise what ends the task in
    the state that says why (``Retry``, or ``Ignore`` after storing a custom state)."""
    status = meta.status
    carries = status in (Status.DONE, Status.FAILED) and _carries_canvas(task, meta)
    fields: dict[str, Any] = {
        "thread_id": meta.thread_id,
        "step": meta.step,
        "status": status.value,
    }
    if status == Status.QUEUED and waiting_for is not None:
        fields.update(concurrency_key=waiting_for.key, position=waiting_for.position)
        _event(task, "task-waiting-for-key", **fields)
        _store_unfinished(task, meta, WAITING_FOR_KEY, fields)
        raise Ignore()
    if status == Status.DONE:
        request = _first_request(task, meta, carries)
        if request is not None:
            canvas.succeeded(task, request, meta.result, store_result=stores_results(task))
        elif meta.canvas is None:
            _for_origin(
                task,
                meta,
                lambda backend, id, first: backend.mark_as_done(id, meta.result, request=first),
            )
        return meta.result
    if status == Status.RETRYING and retrying is not None:
        exc, delay = retrying
        due = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=delay)
        _event(task, "task-retrying", **fields, due_at=due.timestamp(), error=meta.error)
        message = (
            f"thread {meta.thread_id!r} retries step {meta.step + 1} at {due.isoformat()} "
            f"after {type(exc).__name__}: {exc}"
        )
        raise Retry(message, exc=exc, when=due) from exc
    if status == Status.CANCELLED:
        _event(task, "task-revoked", terminated=False, signum=None, expired=False, **fields)
        # The canvas first: this task's own end, once stored, says a copy of its message
        # that it ran to its end (and carried the canvas on) already.
        cancelled(task, meta, retried=True)
        if task.request.id != meta.origin:
            reason = f"thread {meta.thread_id} was cancelled"
            _store(task, lambda backend, id: backend.mark_as_revoked(id, reason))
        raise Ignore()
    if status == Status.FAILED:  # failed for lost workers, or before this message came
        raise _stopped(task, meta, carries)
    event, state = _EVENTS.get(status, ("task-handed-over", HANDED_OVER))
    if status == Status.WAITING:
        fields["interrupt"] = meta.interrupt
        fields["timeout_at"] = meta.timeout_at
    elif status == Status.NEEDS_ATTENTION:
        fields["error"] = meta.error
    _event(task, event, **fields)
    _store_unfinished(task, meta, state, fields)
    raise Ignore()


def _stopped(task: Task, meta: ThreadMeta, carries: bool) -> ThreadStopped:
    """The error that ends a task finding its thread failed, once the first task's canvas
    (or, without one, its state) says the thread failed."""
    stopped = _failure(meta)
    if request := _first_request(task, meta, carries):
        canvas.failed(task, request, stopped, store_result=stores_results(task))
    elif meta.canvas is None:
        # Failed here for its lost workers, the first task's message long gone (a killed
        # worker, or a requeued one that found the lease held and ended HANDED_OVER):
        # without this its get() would wait forever. A failure the first task already
        # holds keeps its own error.
        fail = functools.partial(_fail_unless_ready, exc=stopped)
        _reported(task, "failing its first task", lambda: _for_origin(task, meta, fail))
    return stopped


def given_back(task: Task, thread_id: str, exc: BaseException, requeued: bool) -> NoReturn:
    """End the task whose store stayed out for longer than its calls could wait: its thread
    is not failed, and recovery sends it again (at once if the store, back, ``requeued``
    it, else once its lease runs out), so the task ends ``HANDED_OVER`` with the store's
    error."""
    error = f"{type(exc).__name__}: {exc}"
    logger.warning(
        "thread %s: the store stayed unreachable (%s); recovery sends the thread again %s",
        thread_id,
        error,
        "now" if requeued else "once its lease runs out",
    )
    fields = {"thread_id": thread_id, "error": error}
    _event(task, "task-handed-over", **fields)
    _store(
        task,
        lambda backend, id: backend.store_result(id, fields, HANDED_OVER, request=task.request),
    )
    raise Ignore() from exc


def failed(task: Task, meta: ThreadMeta | None, exc: BaseException) -> None:
    """Store the error of a task that failed its thread under the thread's first task id,
    failing the first task's chain and chord and running its errbacks."""
    if meta is None or meta.status != Status.FAILED:
        return
    if meta.canvas is None:
        _for_origin(
            task,
            meta,
            lambda backend, id, first: backend.mark_as_failure(id, exc, request=first),
        )
        return
    carries = _carries_canvas(task, meta)
    if request := _first_request(task, meta, carries):
        canvas.failed(task, request, exc, store_result=stores_results(task))


def timed_out(task: Task, meta: ThreadMeta, message_id: str, exc: BaseException) -> None:
    """Fail the first task's canvas for a thread failed because its message ``message_id``
    outlived its hard time limit. Celery marks that message's failure itself, with its own
    canvas: when it is the thread's first, the store only names it as the canvas's taker,
    so that no later task carries the canvas on again."""
    if meta.origin is None:
        return
    own = meta.origin == message_id
    if meta.canvas is not None and _takes_canvas(task, meta, message_id) and not own:
        request = canvas.request_of(meta, task.app.conf.accept_content, task.request)
        if request is not None:
            canvas.failed(task, request, exc, store_result=stores_results(task))
    elif meta.canvas is None and not own and stores_results(task):
        first = canvas.first_request(meta, task.request)
        task.backend.mark_as_failure(meta.origin, exc, request=first)


def cancelled(task: Task, meta: ThreadMeta, *, retried: bool = False) -> None:
    """Revoke the thread's first task, as Celery revokes a task: marked ``REVOKED``, its
    chord counts the part as failed (by the task, or the caller of ``cancel()``, the store
    names to carry the canvas on; again only by a copy of that task's message, as Celery
    counts a redelivered failure again), and no callback or chain runs. ``retried``: in
    the task that ended the thread, which waits for a store error to pass."""
    if meta.origin is None:
        return
    reason = f"thread {meta.thread_id} was cancelled"
    request: Context | None = None
    # A cancel() outside a task is a taker of its own: a second one finds the canvas taken.
    taker = task.request.id or uuid.uuid4().hex
    if meta.canvas is not None and _takes_canvas(task, meta, taker, retried=retried):
        own = meta.origin == task.request.id
        accept = task.app.conf.accept_content
        request = task.request if own else canvas.request_of(meta, accept, task.request)
    if request is not None:
        task.backend.mark_as_revoked(
            meta.origin, reason, request=request, store_result=stores_results(task)
        )
    elif stores_results(task):  # no canvas to carry on: its name and arguments kept
        first = canvas.first_request(meta, task.request)
        task.backend.mark_as_revoked(meta.origin, reason, request=first)


def stores_results(task: Task) -> bool:
    """Whether the task's states go to its result backend: not with ``ignore_result``,
    the task's or the message's, as Celery decides it."""
    ignored = get_actual_ignore_result(task, task.request)
    return not ignored and not isinstance(task.backend, DisabledBackend)


def progress_reports(task: Task) -> tuple[bool, bool]:
    """Whether this run's step reports go to the result backend, and as ``task-progress``
    events. Decided once per run and kept on its request: asking Celery's configuration
    each step cost a tenth of a step's own CPU."""
    request = task.request
    decided: tuple[bool, bool] | None = getattr(request, _PROGRESS_REPORTS, None)
    if decided is None:
        decided = (
            bool(request.id) and stores_results(task),
            bool(request.hostname) and bool(task.app.conf.worker_send_task_events),
        )
        setattr(request, _PROGRESS_REPORTS, decided)
    return decided


def _store(task: Task, write: Any) -> None:
    if stores_results(task) and task.request.id:
        _reported(task, "storing its state", lambda: write(task.backend, task.request.id))


def _store_unfinished(task: Task, meta: ThreadMeta, state: str, fields: dict[str, Any]) -> None:
    """Store the state of a task that leaves its thread unfinished. Under the thread's
    first task id it may land after the thread's end: a resume or ``cancel()`` as soon as
    the thread waits (one that reacts to ``task-waiting``), then a task that fails it,
    stored the final state first, which this one would hide from ``get()`` for ever
    (Celery's backends keep only a ``SUCCESS`` from being overwritten). So a final state
    found there is left alone, and the thread is read again after the write, for an end
    stored in between."""
    origin = meta.origin
    checked = (
        origin is not None
        and origin == task.request.id
        and stores_results(task)
        and not _is_rpc(task.backend)  # its state is a message to the caller: none to read
    )
    if checked and origin is not None and _ready(task, origin):
        return
    _store(task, lambda backend, id: backend.store_result(id, fields, state, request=task.request))
    if checked:
        _reported(task, "looking at its thread again", lambda: _restore_end(task, meta))


def _stored_state(task: Task, task_id: str) -> str | None:
    """The state the backend holds for ``task_id``; ``None`` if it cannot say (no results
    stored, an ``rpc://`` backend, the backend out)."""
    if not stores_results(task) or _is_rpc(task.backend):
        return None
    try:
        return str(task.backend.get_state(task_id))
    except Exception:
        return None


def _ready(task: Task, task_id: str) -> bool:
    """Whether the backend holds a final state for ``task_id``; ``False`` if it cannot
    say, so that the task's own state is stored (or, the backend out, logged)."""
    return bool(_stored_state(task, task_id) in states.READY_STATES)


def _succeeded(task: Task, task_id: str) -> bool:
    """Whether the backend holds ``SUCCESS`` for ``task_id``; ``False`` if it cannot say."""
    return bool(_stored_state(task, task_id) == states.SUCCESS)


def _restore_end(task: Task, meta: ThreadMeta) -> None:
    """Store the end of the thread under its first task id again, if it has ended since
    ``meta`` was read and the backend does not hold a final state for it now. Without its
    canvas, which the task that ended the thread carried on."""
    backend = task.backend
    now = task.agentq.store.meta(meta.thread_id)
    if now is None or now.origin is None or now.origin != meta.origin:
        return
    if now.status not in (Status.DONE, Status.FAILED, Status.CANCELLED):
        return
    if backend.get_state(now.origin) in states.READY_STATES:
        return
    first = canvas.first_request(now, task.request)
    if now.status == Status.DONE:
        backend.mark_as_done(now.origin, now.result, request=first)
    elif now.status == Status.FAILED:
        backend.mark_as_failure(now.origin, _failure(now), request=first)
    else:
        backend.mark_as_revoked(now.origin, f"thread {now.thread_id} was cancelled", first)


def _failure(meta: ThreadMeta) -> ThreadStopped:
    return ThreadStopped(
        "thread is failed" + (f": {meta.error.splitlines()[0]}" if meta.error else ""),
        thread_id=meta.thread_id,
        status=meta.status.value,
        error=meta.error,
    )


def _is_rpc(backend: Any) -> bool:
    return isinstance(backend, RPCBackend)


def _for_origin(task: Task, meta: ThreadMeta, write: Any) -> None:
    """``write(backend, id, request)`` the first task's state: its id and request."""
    if stores_results(task) and meta.origin and meta.origin != task.request.id:
        write(task.backend, meta.origin, canvas.first_request(meta, task.request))


def _fail_unless_ready(backend: Any, task_id: str, request: Context, *, exc: BaseException) -> None:
    # An rpc:// result lives on its caller's queue: no state to read here, and reading it
    # would declare a reply queue for this worker (Celery skips it for the same reason).
    if _is_rpc(backend):
        return
    if backend.get_state(task_id) not in states.READY_STATES:
        backend.mark_as_failure(task_id, exc, request=request)


def _carries_canvas(task: Task, meta: ThreadMeta) -> bool:
    """Whether this task carries the ended thread's canvas on: the store names one task
    for it, the first to find the thread ended (and that task again, redelivered after a
    crash). The thread's first task that is not it ends ``IGNORED``: Celery's tracer
    would apply the canvas a second time."""
    if meta.canvas is None or meta.origin is None:
        return False
    taken = _takes_canvas(task, meta, task.request.id or "", retried=True)
    if not taken and meta.origin == task.request.id:
        raise Ignore()
    return taken


def _takes_canvas(task: Task, meta: ThreadMeta, taker: str, *, retried: bool = False) -> bool:
    """Whether ``taker`` carries the thread's canvas on. ``retried``: a passing store
    error is waited out as the driver's calls wait it out, up to ``lease_ttl``: the
    thread has ended, and a task failed by that error would say the thread failed and
    apply its errbacks (Celery acks a failed task: no redelivery says otherwise later)."""
    store = task.agentq.store
    what = "naming the task that carries its canvas on"
    take: Callable[[str, str], bool] = store.take_canvas
    if retried:
        calls = RetriedCalls(store, meta.thread_id, task.agentq.settings.lease_ttl)
        take = functools.partial(calls, what, store.take_canvas)
    taken = bool(task._store_call(what, meta.thread_id, take, meta.thread_id, taker))
    if taken and taker and taker == task.request.id and _succeeded(task, taker):
        # This message ran to its end before (a copy of it: RabbitMQ redelivering on a
        # lost connection, a visibility timeout restoring it), and its success is stored
        # only once its callbacks and the chain's next task went out (by Celery's tracer,
        # after canvas.succeeded): taken again, the callbacks would run twice (a chord
        # counts the part just after the success is stored; a worker killed in between
        # leaves it uncounted, as in Celery without agentq). A failure
        # is stored before the errbacks run, and when sending a callback failed: a copy
        # of that message carries the canvas on again, as acks_late runs it.
        logger.info(
            "thread %s: %s[%s] ran to its end before; its canvas went on then",
            meta.thread_id,
            task.name,
            taker,
        )
        return False
    return taken


def _first_request(task: Task, meta: ThreadMeta, carries: bool) -> Context | None:
    """The first task's request with its canvas, for another task that carries it on:
    the first task's own is Celery's tracer's to carry on."""
    if not carries or meta.origin == task.request.id:
        return None
    return canvas.request_of(meta, task.app.conf.accept_content, task.request)


def _event(task: Task, type_: str, **fields: Any) -> None:
    if task.app.conf.worker_send_task_events and task.request.hostname:
        _reported(task, f"sending {type_}", lambda: task.send_event(type_, **fields))


def _reported(task: Task, what: str, report: Callable[[], object]) -> None:
    """``report()`` the task's state or event: what became of its thread, which the store
    holds already. One that fails (the broker or backend out, a question JSON cannot
    encode, such as a set) is logged: failing the task would run its errbacks over a
    thread that did not fail."""
    try:
        report()
    except Exception:
        logger.warning(
            "%s[%s]: %s failed; its thread's state is in the store",
            task.name,
            task.request.id,
            what,
            exc_info=True,
        )


__all__ = [
    "HANDED_OVER",
    "NEEDS_ATTENTION",
    "WAITING",
    "WAITING_FOR_KEY",
    "cancelled",
    "failed",
    "finish",
    "given_back",
    "progress_reports",
    "stores_results",
]
