"""How long a ``shared=True`` tool's key is remembered, on an in-process worker: as long
as a finished thread is (``finished_ttl``), from when its outcome was recorded; then the
next thread using the key runs the tool again, as a payment API's idempotency key expires."""

from __future__ import annotations

import threading
import uuid

from celery import Celery
from celery.contrib.testing.worker import start_worker

import agentq
from agentq import Done, Run
from tests.support.redis_server import RedisServer, wait_until


def test_a_shared_key_older_than_finished_ttl_runs_its_tool_again(
    redis_broker: str, redis_server: RedisServer
) -> None:
    prefix = f"sk{uuid.uuid4().hex[:8]}:"
    app = Celery("agentq-shared-key-retention", broker=redis_broker, set_as_current=False)
    app.conf.update(
        task_default_queue=f"agentq-test-{prefix}",
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    agentq.init_app(app, store=redis_server.url, prefix=prefix, finished_ttl=0.2)
    invoiced: list[str] = []
    lock = threading.Lock()

    def invoice(order: str) -> str:
        with lock:
            invoiced.append(order)
            return f"in_{len(invoiced)}"

    agent = agentq.agent(app, "tests.shared_invoices")

    @agent.node
    def start(run: Run, order: str) -> Done:
        return Done(run.tool(invoice, order, key=f"invoice-{order}", shared=True))

    store = app._agentq_runtime.store
    with start_worker(
        app, pool="threads", concurrency=2, perform_ping_check=False, shutdown_timeout=30
    ):
        agent.delay("t1", order="o-1")
        wait_until(lambda: invoiced == ["o-1"], timeout=30, what="the first invoice")
        wait_until(
            lambda: store.effect("t1", "invoice-o-1", shared=True) is None,
            timeout=10,
            what="the shared key forgotten past finished_ttl",
        )
        agent.delay("t2", order="o-1")
        wait_until(lambda: invoiced == ["o-1", "o-1"], timeout=30, what="the second invoice")
    store.close()
    app.close()
