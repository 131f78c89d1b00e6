"""The Celery app a ``celery worker`` subprocess loads in the crash tests (``-A``).

Configured from the environment by ``tests.support.workers.WorkerProcess``.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading

from agentq.engine.aio import run_coroutine
from tests.support.agents import make_app

app = make_app(
    broker=os.environ["AGENTQ_TEST_BROKER"],
    store=os.environ["AGENTQ_TEST_STORE"],
    prefix=os.environ["AGENTQ_TEST_PREFIX"],
    # The queue its worker consumes (-Q), unless the test routes the agents elsewhere.
    queue=os.environ.get("AGENTQ_TEST_DEFAULT_QUEUE") or os.environ["AGENTQ_TEST_QUEUE"],
    ledger_url=os.environ["AGENTQ_TEST_LEDGER"],
    lease_ttl=float(os.environ.get("AGENTQ_TEST_LEASE_TTL", "2")),
    sweep_interval=0.2,
    start_grace=float(os.environ.get("AGENTQ_TEST_START_GRACE", "3")),
    max_crashes=int(os.environ.get("AGENTQ_TEST_MAX_CRASHES", "3")),
)
app.conf.worker_prefetch_multiplier = 1
if os.environ.get("AGENTQ_TEST_BACKEND"):
    app.conf.result_backend = os.environ["AGENTQ_TEST_BACKEND"]
if os.environ.get("AGENTQ_TEST_MAX_TASKS_PER_CHILD"):
    app.conf.worker_max_tasks_per_child = int(os.environ["AGENTQ_TEST_MAX_TASKS_PER_CHILD"])

if os.environ.get("AGENTQ_TEST_LOOP_BEFORE_FORK"):
    # The main process starts agentq's loop, so that prefork's children inherit it forked.
    run_coroutine(asyncio.sleep(0))

if os.environ.get("AGENTQ_TEST_FORK_LOG"):

    def _note_threads() -> None:
        # The threads of the process about to fork (a prefork worker's main process,
        # forking a pool child), one line a fork.
        names = sorted(thread.name for thread in threading.enumerate())
        with open(os.environ["AGENTQ_TEST_FORK_LOG"], "a") as log:
            log.write(json.dumps({"pid": os.getpid(), "threads": names}) + "\n")

    os.register_at_fork(before=_note_threads)
