"""The Celery app the concurrency-key tests' worker subprocesses load (``-A``): one agent
of two steps that logs, in Redis (whichever store it runs on), when each thread starts
and how many run at once.

Configured from the environment by ``tests.celery.test_concurrency_keys``.
"""

from __future__ import annotations

import os
from typing import Any

import redis
from celery import Celery

import agentq
from agentq import AgentTask, Done, Run

LIMITS = [
    agentq.limit("tenant:{tenant_id}", threads=2),
    agentq.limit("tenant:solo", threads=1),
    agentq.limit("calls-only", concurrency=3),
]


class KeyedAgent(AgentTask):
    """Step ``start`` counts the thread in (``<ns>:running``, its peak in
    ``<ns>:peaks``, its id in ``<ns>:started``); with ``block`` it then waits until
    ``<ns>:go`` exists, else for ``work`` seconds (if any) of a blocking pop nobody feeds. Step
    ``finish`` counts it out: the slot is held across both steps."""

    name = "tests.keyed_agent"

    def _ledger(self) -> tuple[redis.Redis, str]:
        return redis.Redis.from_url(self.app.conf.test_ledger_url), self.app.conf.test_ledger_ns

    def start(self, run: Run, block: bool = False, work: float = 0.2) -> str:
        ledger, ns = self._ledger()
        ledger.rpush(f"{ns}:peaks", ledger.incr(f"{ns}:running"))
        ledger.rpush(f"{ns}:started", run.thread_id)
        if block:
            while not ledger.exists(f"{ns}:go"):
                ledger.blpop([f"{ns}:wake"], timeout=0.2)
        elif work:  # a timeout of 0 would block for ever
            ledger.blpop([f"{ns}:never"], timeout=work)
        return "finish"

    def finish(self, run: Run) -> Done:
        ledger, ns = self._ledger()
        ledger.decr(f"{ns}:running")
        return Done(run.thread_id)


def make_keyed_app(
    *,
    broker: str,
    store: str,
    ledger: str,
    prefix: str,
    queue: str,
    backend: str | None = None,
    **settings: Any,
) -> Celery:
    app = Celery("agentq-key-tests", broker=broker, backend=backend, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=1,
        test_ledger_url=ledger,
        test_ledger_ns=prefix.rstrip(":"),
    )
    agentq.init_app(app, store=store, prefix=prefix, limits=LIMITS, **settings)
    app.register_task(KeyedAgent())
    return app


if "AGENTQ_TEST_PREFIX" in os.environ:
    app = make_keyed_app(
        broker=os.environ["AGENTQ_TEST_BROKER"],
        store=os.environ["AGENTQ_TEST_STORE"],
        ledger=os.environ["AGENTQ_TEST_LEDGER"],
        prefix=os.environ["AGENTQ_TEST_PREFIX"],
        queue=os.environ["AGENTQ_TEST_QUEUE"],
        backend=os.environ.get("AGENTQ_TEST_BACKEND"),
        lease_ttl=float(os.environ["AGENTQ_TEST_LEASE_TTL"]),
        # A test may make the sweep too rare to wake anyone: a freed slot must do it.
        sweep_interval=float(os.environ.get("AGENTQ_TEST_SWEEP_INTERVAL", "0.2")),
    )
