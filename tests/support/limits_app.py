"""The Celery app the limit tests' worker subprocesses load (``-A``): one agent whose
tool calls take from fleet-wide limits and log, in Redis, when each one ran.

Configured from the environment by ``tests.engine.test_limits``.
"""

from __future__ import annotations

import os
from typing import Any

import redis
from celery import Celery

import agentq
from agentq import AgentTask, Done, Run
from tests.support.agents import RateLimitError

LIMITS = [
    agentq.limit("api", requests_per_minute=600, burst=2),
    agentq.limit("slow", requests_per_minute=60, burst=1),
    agentq.limit("one-at-a-time", concurrency=1),
    agentq.limit("provider", requests_per_minute=6000),
    agentq.limit("tokens", tokens_per_minute=60),
]


class LimitedAgent(AgentTask):
    """Makes ``calls`` tool calls under ``limit``; each pushes the server's time onto
    ``<ns>:calls``. With ``block`` the call waits until ``<ns>:go`` exists; with
    ``refuse`` the first call raises a 429 asking to wait that many seconds. Each call takes
    ``cost`` tokens; with ``used`` it settles that many instead, and with ``fail_once`` the
    node fails once after its calls, so that they replay when it runs again."""

    name = "tests.limited_agent"
    retry_on = (RateLimitError,)

    def start(
        self,
        run: Run,
        calls: int,
        limit: str,
        block: bool = False,
        refuse: int = 0,
        cost: float = 1,
        used: Any = None,
        fail_once: bool = False,
    ) -> Done:
        ledger = redis.Redis.from_url(self.app.conf.test_ledger_url)
        ns = self.app.conf.test_ledger_ns

        def call(idempotency_key: str) -> str:
            if block:
                ledger.rpush(f"{ns}:holding", run.thread_id)
                while not ledger.exists(f"{ns}:go"):
                    ledger.blpop([f"{ns}:wake"], timeout=0.2)
            if refuse and ledger.incr(f"{ns}:refused") == 1:
                raise RateLimitError(str(refuse))
            seconds, micros = ledger.time()
            ledger.rpush(f"{ns}:calls", f"{seconds + micros / 1e6:.6f}")
            return idempotency_key

        settle = None if used is None else (lambda result: used)
        done = [run.tool(call, limit=limit, cost=cost, actual_cost=settle) for _ in range(calls)]
        if fail_once and ledger.incr(f"{ns}:failed:{run.thread_id}") == 1:
            raise RateLimitError("0.1")
        return Done(done)


def make_limits_app(*, broker: str, store: str, prefix: str, queue: str, **settings: Any) -> Celery:
    app = Celery("agentq-limit-tests", broker=broker, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=1,
        worker_send_task_events=True,
        test_ledger_url=store,
        test_ledger_ns=prefix.rstrip(":"),
    )
    agentq.init_app(app, store=store, prefix=prefix, limits=LIMITS, **settings)
    app.register_task(LimitedAgent())
    return app


if "AGENTQ_TEST_PREFIX" in os.environ:
    app = make_limits_app(
        broker=os.environ["AGENTQ_TEST_BROKER"],
        store=os.environ["AGENTQ_TEST_STORE"],
        prefix=os.environ["AGENTQ_TEST_PREFIX"],
        queue=os.environ["AGENTQ_TEST_QUEUE"],
        lease_ttl=float(os.environ["AGENTQ_TEST_LEASE_TTL"]),
        sweep_interval=0.2,
        limit_wait=0.5,
    )
