"""The app of a ``celery worker`` subprocess whose agent outlives its hard time limit once
(``-A``), configured from the environment by ``tests.recovery.test_time_limit``."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis
from celery import Celery

import agentq
from agentq import AgentTask, Done, Run


def _ledger() -> redis.Redis:
    return redis.Redis.from_url(os.environ["AGENTQ_TEST_LEDGER"], decode_responses=True)


def _key(*parts: str) -> str:
    return ":".join((os.environ["AGENTQ_TEST_PREFIX"], *parts))


class SlowOnceAgent(AgentTask):
    """Its second node hangs past the task's hard time limit the first time it runs."""

    name = "tests.slow_once"
    time_limit = 3

    def start(self, run: Run) -> str:
        return "slow"

    def slow(self, run: Run) -> Any:
        if _ledger().incr(_key("slow", run.thread_id)) == 1:
            time.sleep(60)  # killed by the hard time limit
        return Done("finished")


class SlowReportAgent(AgentTask):
    """The report of its step ``slow_at`` (a slow result backend, a progress webhook)
    outlasts the task's soft time limit; step 1 ends the thread."""

    name = "tests.slow_report"
    soft_time_limit = 2

    def start(self, run: Run, slow_at: int) -> str:
        run.state["slow_at"] = slow_at
        return "finish"

    def finish(self, run: Run) -> Any:
        return Done("finished")

    def on_step(
        self,
        thread_id: str,
        step: int,
        node: str,
        next_node: str | None,
        *,
        limit_waits: Sequence[dict[str, Any]] = (),
    ) -> None:
        super().on_step(thread_id, step, node, next_node, limit_waits=limit_waits)
        latest = self.agentq.store.latest(thread_id)
        if latest is not None and latest.state.get("slow_at") == step:
            threading.Event().wait(60)  # cut short by the soft time limit's signal


def note(tag: str) -> None:
    _ledger().rpush(_key("notes"), tag)


def make(broker: str, backend: str, store: str, prefix: str, queue: str) -> Celery:
    app = Celery("time-limit", broker=broker, backend=backend, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=1,
    )
    agentq.init_app(
        app, store=store, prefix=prefix, lease_ttl=2.0, sweep_interval=0.2, start_grace=3.0
    )
    app.register_task(SlowOnceAgent())
    app.register_task(SlowReportAgent())
    app.task(name="tests.note")(note)
    return app


if "AGENTQ_TEST_BROKER" in os.environ:
    app = make(
        os.environ["AGENTQ_TEST_BROKER"],
        os.environ["AGENTQ_TEST_BACKEND"],
        os.environ["AGENTQ_TEST_STORE"],
        os.environ["AGENTQ_TEST_PREFIX"] + ":",
        os.environ["AGENTQ_TEST_QUEUE"],
    )
