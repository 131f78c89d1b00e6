"""Sending a stopped thread on again, as the command line and the inspector both do:
queue it in the store, then send its message at once with an app, or leave it to the
workers' sweeper (which sends every due thread) without one."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from agentq.celery.task import resend_thread
from agentq.records import Status
from agentq.store.contract import UNSET, Store


@dataclass(frozen=True)
class Requeued:
    """A thread queued again: its status now, and the Celery task id of the message sent
    (``None`` when the sweeper will send it)."""

    thread_id: str
    status: Status
    sent: str | None


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
    one it gets ``start_grace`` for the message sent now to arrive."""
    meta = store.reopen(
        thread_id,
        from_statuses=from_statuses,
        resume_value=value,
        start_grace=0 if app is None else start_grace,
    )
    sent = None if app is None else resend_thread(app, meta).id
    return Requeued(thread_id, meta.status, sent)


def settle(
    store: Store,
    app: Any,
    thread_id: str,
    key: str,
    *,
    result: Any = UNSET,
    did_not_run: bool = False,
    start_grace: float,
) -> Requeued:
    """Settle the effect ``key`` nobody recorded (see ``Store.resolve_effect``) and send
    the thread on as :func:`requeue` does."""
    meta = store.resolve_effect(
        thread_id,
        key,
        result=result,
        did_not_run=did_not_run,
        start_grace=0 if app is None else start_grace,
    )
    sent = None if app is None else resend_thread(app, meta).id
    return Requeued(thread_id, meta.status, sent)
