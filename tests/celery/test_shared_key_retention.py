"""How long a ``shared=True`` tool's key is remembered, on an in-process worker: as long
as a finished thread is (``finished_ttl``), from when its outcome was recorded; then the
next thread that never used the key runs the tool again, as a payment API's idempotency
key expires. A thread that used it keeps the outcome for as long as the thread lives."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

import agentq
from agentq import Done, FunctionAgent, Run, Status
from agentq.store.contract import Store
from tests.support.redis_server import RedisServer, wait_until

FINISHED_TTL = 0.2


@dataclass
class Env:
    agent: FunctionAgent
    store: Store
    invoiced: list[str]


@pytest.fixture(params=["redis", "sqlite"])
def env(
    request: pytest.FixtureRequest, redis_broker: str, redis_server: RedisServer, tmp_path: Path
) -> Iterator[Env]:
    prefix = f"sk{uuid.uuid4().hex[:8]}:"
    app = Celery("agentq-shared-key-retention", broker=redis_broker, set_as_current=False)
    app.conf.update(
        task_default_queue=f"agentq-test-{prefix}",
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    url = redis_server.url if request.param == "redis" else f"sqlite:///{tmp_path / 'a.db'}"
    agentq.init_app(app, store=url, prefix=prefix, finished_ttl=FINISHED_TTL)
    invoiced: list[str] = []
    lock = threading.Lock()

    def invoice(order: str) -> str:
        with lock:
            invoiced.append(order)
            return f"in_{len(invoiced)}"

    agent = agentq.agent(app, "tests.shared_invoices")

    @agent.node
    def start(run: Run, order: str, confirm: bool = False) -> Done:
        number = run.tool(invoice, order, key=f"invoice-{order}", shared=True)
        if confirm:
            # The node runs again from its start when the person answers.
            run.interrupt({"send": number})
        return Done(number)

    store = app._agentq_runtime.store
    with start_worker(
        app, pool="threads", concurrency=2, perform_ping_check=False, shutdown_timeout=30
    ):
        yield Env(agent, store, invoiced)
    store.close()
    app.close()


def forgotten(env: Env, thread_id: str, key: str) -> None:
    wait_until(
        lambda: env.store.effect(thread_id, key, shared=True) is None,
        timeout=10,
        what="the shared key forgotten past finished_ttl",
    )


def test_a_shared_key_older_than_finished_ttl_runs_its_tool_again(env: Env) -> None:
    env.agent.delay("t1", order="o-1")
    assert env.agent.wait("t1", timeout=30) == "in_1"
    forgotten(env, "t1", "invoice-o-1")
    env.agent.delay("t2", order="o-1")
    assert env.agent.wait("t2", timeout=30) == "in_2"
    assert env.invoiced == ["o-1", "o-1"]


def test_a_thread_waiting_past_finished_ttl_replays_its_shared_call_without_running_it(
    env: Env,
) -> None:
    env.agent.delay("t1", order="o-1", confirm=True)
    wait_until(
        lambda: env.agent.thread("t1").status == Status.WAITING,
        timeout=30,
        what="t1 waiting for its confirmation",
    )
    forgotten(env, "t1", "invoice-o-1")
    env.agent.resume("t1", "yes")
    assert env.agent.wait("t1", timeout=30) == "in_1"
    assert env.invoiced == ["o-1"]
    # A thread that never used the key runs the call again, as the key expired.
    env.agent.delay("t3", order="o-1")
    assert env.agent.wait("t3", timeout=30) == "in_2"
    assert env.invoiced == ["o-1", "o-1"]
