"""Acting on a thread as the command line and the inspector both do. Sending a stopped
thread on again: queue it in the store, then send its message at once with an app, or
leave it to the workers' sweeper (which sends every due thread) without one, or when that
send fails. Cancelling it: through its task with an app, as ``agent.cancel()`` does, or
in the store alone."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from agentq.celery.task import AgentTask, key_sent_with, resend_thread, send_reopened
from agentq.errors import MessageNotSent
from agentq.records import Status, ThreadMeta
from agentq.store.contract import UNSET, Store


@dataclass(frozen=True)
class Requeued:
    """A thread queued again: its status now, the Celery task id of the message sent
    (``None`` when the sweeper will send it), and why the message was not sent when the
    app could not send it (the thread stays queued; the sweeper sends it when due)."""

    thread_id: str
    status: Status
    sent: str | None
    not_sent: MessageNotSent | None = None


def _send(app: Any, meta: ThreadMeta, start_grace: float) -> Requeued:
    # Not raised: the store's change is made, and the caller reports both halves.
    if app is None:
        return Requeued(meta.thread_id, meta.status, None)
    try:
        sent = send_reopened(meta, start_grace, lambda: resend_thread(app, meta))
    except MessageNotSent as exc:
        return Requeued(meta.thread_id, meta.status, None, exc)
    return Requeued(meta.thread_id, meta.status, sent.id)


def requeue(
    store: Store,
    app: Any,
    thread_id: str,
    *,
    from_statuses: Collection[Status],
    value: Any = UNSET,
    start_grace: float,
) -> Requeued:
    """Reopen a thread in one of ``from_statuses`` (with ``value`` as its resume value when
    given). Without an app it is due at once, so a sweeper sends it on its next pass; with
    one it gets ``start_grace`` for the message sent now to arrive, after which a sweeper
    sends it if that message never came or could not be sent (``Requeued.not_sent``)."""
    meta = store.reopen(
        thread_id,
        from_statuses=from_statuses,
        resume_value=value,
        start_grace=0 if app is None else start_grace,
    )
    return _send(app, meta, start_grace)


def settle(
    store: Store,
    app: Any,
    thread_id: str,
    key: str,
    *,
    result: Any = UNSET,
    did_not_run: bool = False,
    start_grace: float,
    shared: bool = False,
) -> Requeued:
    """Settle the effect ``key`` nobody recorded (see ``Store.resolve_effect``) and send
    the thread on as :func:`requeue` does."""
    meta = store.resolve_effect(
        thread_id,
        key,
        result=result,
        did_not_run=did_not_run,
        start_grace=0 if app is None else start_grace,
        shared=shared,
    )
    return _send(app, meta, start_grace)


@dataclass(frozen=True)
class Cancelled:
    """A cancel asked for: the thread's status after it, and whether its first Celery
    task was marked ``REVOKED`` (only the app knows the result backend to mark it in; a
    running thread's task marks it when the thread stops)."""

    thread_id: str
    status: Status
    task_revoked: bool


def cancel(store: Store, app: Any, thread_id: str) -> Cancelled:
    """Cancel the thread: at once if idle, at its next step boundary if running. With an
    app that has the thread's task, as ``agent.cancel()`` does: its first task is marked
    ``REVOKED`` (``get()`` returns), and a slot its concurrency key reserved for it starts
    the next waiter now. Without one, in the store alone: the slot is given back, for the
    workers' sweeper to send the next waiter, and the first task keeps its state."""
    meta = store.meta(thread_id)
    task = app.tasks.get(meta.task) if app is not None and meta is not None else None
    if isinstance(task, AgentTask):
        status = task.cancel(thread_id)
        return Cancelled(thread_id, status, status == Status.CANCELLED)
    status = store.request_cancel(thread_id)
    if status == Status.CANCELLED and meta is not None and (key := key_sent_with(meta)):
        # Due at once: no message is sent here, the next sweep sends the woken waiters.
        store.leave_key(thread_id, meta.fence, key, start_grace=0)
    return Cancelled(thread_id, status, False)
