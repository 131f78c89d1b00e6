"""The worker's request of an agent task: a hard time limit fails the thread, as it fails
the task, and a revoke of the thread's first task reaches its later messages.

When a task outlives its ``time_limit``, the pool kills the process running it and the
worker's main process marks the task ``FAILURE`` with ``TimeLimitExceeded`` and runs its
errbacks. The thread, left ``running`` under the killed process's lease, would otherwise be
taken for a lost worker's: re-sent, run again and finished, its first task turned from
``FAILURE`` to ``SUCCESS`` and its callbacks run after its errbacks. So the thread fails
here too, under that lease (a worker that took it over since keeps it), and its first
task's canvas is carried on as a failure, once.

``AsyncResult.revoke()`` puts the task id in the revoked set of every worker it reaches,
and a worker drops a message whose id is there. A thread parked on its concurrency key
is sent again under a new id when woken, which that set does not hold: each later
message names the thread's first task (``ORIGIN_HEADER``), and the worker's main process,
the one that revoke broadcasts reach, tells the task whether that task is revoked
(``FIRST_REVOKED``) as it hands the message to its pool.
"""

from __future__ import annotations

import logging
import os
import socket

from celery.exceptions import TimeLimitExceeded
from celery.worker import state as worker_state
from celery.worker.request import Request

from agentq.celery import task_outcome
from agentq.celery.task import FIRST_REVOKED, ORIGIN_HEADER
from agentq.errors import StaleToken
from agentq.records import Status

logger = logging.getLogger("agentq")


class AgentRequest(Request):  # type: ignore[misc]
    def revoked(self) -> bool:
        """Celery's check, which it makes in the main process just before it hands the
        message to its pool (the worker's request class overrides ``execute_using_pool``
        but calls this): the moment to tell the task whether the thread's first task is
        revoked now."""
        if super().revoked():
            return True
        origin = self._request_dict.get(ORIGIN_HEADER)
        # Always set: a value the sender put in the headers is not the worker's to trust.
        self._request_dict[FIRST_REVOKED] = (
            origin is not None and origin != self.id and origin in worker_state.revoked
        )
        return False

    def on_timeout(self, soft: bool, timeout: float) -> None:
        if not soft:
            try:
                self._fail_thread(timeout)
            except Exception:
                # Left as a lost worker's: recovery runs the thread again.
                logger.exception("%s[%s]: could not fail its thread", self.name, self.id)
        super().on_timeout(soft, timeout)

    def _fail_thread(self, timeout: float) -> None:
        args = self.args
        if not args or not isinstance(args[0], str):
            return
        thread_id, task = args[0], self.task
        store = task.agentq.store
        (lease,) = store.schedules([thread_id])
        # The killed prefork child's, or this process's where the pool runs tasks in it
        # (gevent, eventlet: worker_pid names a greenlet there).
        ran = {f"{socket.gethostname()}:{pid}:" for pid in (self.worker_pid, os.getpid())}
        owner = lease.owner or ""
        if lease.token is None or not any(owner.startswith(prefix) for prefix in ran):
            return
        meta = store.meta(thread_id)
        if meta is None:
            return
        error = (
            f"TimeLimitExceeded: the task's hard time limit ({timeout} s) killed the worker "
            f"process running step {meta.step + 1}; make the step finish in time (or raise "
            "time_limit), then retry the thread (retry_thread)"
        )
        try:
            store.set_status(
                thread_id,
                lease.token,
                Status.FAILED,
                error=error,
                release_owner=owner,
                # The pool kills the child after this: until then it may still commit.
                raise_fence=True,
            )
        except StaleToken:
            return  # another worker drives it now
        logger.error("thread %s: failed: %s", thread_id, error)
        task_outcome.timed_out(task, meta, self.id, TimeLimitExceeded(timeout))
