"""The worker's request of an agent task: a hard time limit fails the thread, as it fails
the task.

When a task outlives its ``time_limit``, the pool kills the process running it and the
worker's main process marks the task ``FAILURE`` with ``TimeLimitExceeded`` and runs its
errbacks. The thread, left ``running`` under the killed process's lease, would otherwise be
taken for a lost worker's: re-sent, run again and finished, its first task turned from
``FAILURE`` to ``SUCCESS`` and its callbacks run after its errbacks. So the thread fails
here too, under that lease (a worker that took it over since keeps it), and its first
task's canvas is carried on as a failure, once.
"""

from __future__ import annotations

import logging
import os
import socket

from celery.exceptions import TimeLimitExceeded
from celery.worker.request import Request

from agentq.celery import task_outcome
from agentq.errors import StaleToken
from agentq.records import Status

logger = logging.getLogger("agentq")


class AgentRequest(Request):  # type: ignore[misc]
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
