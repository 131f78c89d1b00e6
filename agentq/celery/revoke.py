"""A revoked, expired or terminated message of an agent task cancels its thread.

Celery drops a revoked message (``AsyncResult.revoke()``, or ``expires`` passed before a
worker ran it) and marks its task ``REVOKED``, but the thread it carried lives in the
store. Left ``queued`` there, recovery would send it again under a new task id, which no
worker's revoked set holds: the thread would run after all and its first task would end
``SUCCESS``. A ``revoke(terminate=True)`` kills the process running it, which recovery
would take for a lost worker and run the thread again.

Which revokes stop the thread:

- the thread's first message, whose id is the ``AsyncResult`` that ``delay()`` gave
  back: revoked or terminated, or expired before the thread started, the thread is
  cancelled as ``agent.cancel()`` does;
- the first message revoked after it ran but before the thread committed a step (it
  parked the thread on its concurrency key): no message holds that id any more, so this
  handler never hears of it; the worker about to run a later message of the thread finds
  the first task in its revoked set and the driver cancels the thread, unless a person
  reopened it since (:mod:`agentq.celery.request`);
- any of its messages terminated: someone killed the run of this thread;
- not a later message revoked or expired without terminating it (a re-send by recovery,
  a resume, a second ``delay()`` of a running thread): that message is a duplicate
  nudge, dropping it leaves the thread to the message that carries it.

Celery revokes by task id, so a revoke reaches the thread only through a message a worker
holds or receives, or a later message's look at the revoked set before the thread's first
step: once the thread has committed a step and waits for a human, or runs on under a
later message, ``agent.cancel()`` is what stops it.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from celery.signals import task_revoked

from agentq.celery.task import AgentTask
from agentq.errors import StoreUnavailable, ThreadNotFound
from agentq.records import Status, ThreadMeta

logger = logging.getLogger("agentq")

DISPATCH_UID: Final = "agentq.celery.revoke:cancel_revoked_thread"
"""Connects the handler once per process, however many workers start in it."""


def connect() -> None:
    """Listen to ``task_revoked``, which Celery sends in the worker's main process where
    it drops the message or terminates its process. A strong reference and a
    ``dispatch_uid``, as Celery advises for receivers connected at run time: one
    connection however many workers start in this process."""
    task_revoked.connect(cancel_revoked_thread, weak=False, dispatch_uid=DISPATCH_UID)


def cancel_revoked_thread(
    sender: Any = None,
    request: Any = None,
    terminated: bool = False,
    expired: bool = False,
    **_: Any,
) -> None:
    """The ``task_revoked`` handler: cancel the thread of an agent task's revoked message
    when that revoke means to stop it (see the module's docstring)."""
    if not isinstance(sender, AgentTask):
        return
    thread_id = _thread_of(request)
    if thread_id is None:
        return
    how = "terminated" if terminated else "expired" if expired else "revoked"
    try:
        meta = sender.thread(thread_id)
        if request.id == meta.origin and meta.canvas is not None:
            # Celery counted the revoked first task's chord part: the canvas is applied,
            # by Celery, and no task that ends the thread later applies it again.
            store = sender.agentq.store
            sender._store_call(
                "taking its canvas", thread_id, store.take_canvas, thread_id, request.id
            )
        if not _stops_thread(request.id, meta, terminated, expired):
            logger.info(
                "thread %s: a later message (%s) was %s; the thread carries on (cancel it "
                "with agent.cancel() or 'agentq cancel')",
                thread_id,
                request.id,
                how,
            )
            return
        status = sender.cancel(thread_id)
    except ThreadNotFound:
        return  # deleted since: nothing left to stop
    except StoreUnavailable as exc:
        logger.error(
            "thread %s: its task %s was %s, but the thread is not cancelled: %s; cancel it "
            "with 'agentq cancel %s' once the store answers, or recovery runs it again",
            thread_id,
            request.id,
            how,
            exc,
            thread_id,
        )
        return
    # Running: flagged, it stops at its next step; its process killed, recovery cancels
    # it once the lease of that process runs out, instead of running it again.
    outcome = "cancel requested" if status == Status.RUNNING else status.value
    logger.info("thread %s: its task %s was %s: %s", thread_id, request.id, how, outcome)


def _stops_thread(task_id: str, meta: ThreadMeta, terminated: bool, expired: bool) -> bool:
    if terminated:
        return True
    if task_id != meta.origin:
        return False
    # Expired, it stops a thread that has not started. The first message redelivered
    # after its run was lost (acks_late) may expire long after the thread went on
    # without it: waiting for a person, or running under recovery's message.
    return not expired or (meta.status == Status.QUEUED and meta.step < 0)


def _thread_of(request: Any) -> str | None:
    """The thread id a message carries: its first positional argument."""
    args = getattr(request, "args", None)
    if not args or not isinstance(args[0], str):
        return None
    return args[0]
