"""An async node runs on the event loop every async node of its worker process shares:
the blocking ``run.tool`` and ``run.artifacts.put``/``get`` work there with a warning that
names the awaited form, which makes the store's round trips off the loop."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

import agentq
from agentq import Done, FunctionAgent, Run
from agentq.errors import BlockingOnLoop
from tests.support.redis_server import RedisServer


class Env:
    def __init__(self, app: Celery) -> None:
        self.app = app
        self.agent: FunctionAgent = agentq.agent(app, "tests.async_blocking")
        self.sent: list[str] = []
        agent = self.agent

        def send(to: str) -> str:
            self.sent.append(to)
            return f"sent to {to}"

        @agent.node
        async def start(run: Run, how: str) -> Any:
            if how == "blocking":
                ref = run.artifacts.put(b"report")
                data = run.artifacts.get(ref)
                return Done({"data": data, "sent": run.tool(send, "a@example.com")})
            ref = await run.artifacts.aput(b"%PDF report", "application/pdf")
            sent = await run.atool(send, "b@example.com", key="email-2")
            return Done({"ref": ref, "data": await run.artifacts.aget(ref), "sent": sent})


@pytest.fixture
def env(redis_broker: str, redis_server: RedisServer) -> Iterator[Env]:
    prefix = f"ab{uuid.uuid4().hex[:8]}:"
    app = Celery("agentq-async-blocking", broker=redis_broker, set_as_current=False)
    app.conf.update(
        task_default_queue=f"agentq-test-{prefix}",
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    agentq.init_app(app, store=redis_server.url, prefix=prefix, lease_ttl=5)
    environment = Env(app)
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        yield environment
    app._agentq_runtime.store.close()
    app.close()


def test_blocking_calls_in_an_async_node_work_and_warn(env: Env) -> None:
    with pytest.warns(BlockingOnLoop) as warned:
        env.agent.delay("t1", how="blocking")
        result = env.agent.wait("t1", timeout=30)
    assert result == {"data": b"report", "sent": "sent to a@example.com"}
    messages = [str(w.message) for w in warned if w.category is BlockingOnLoop]
    assert len(messages) == 3, messages
    for fix in ("await run.artifacts.aput(", "await run.artifacts.aget(", "await run.atool("):
        (message,) = (m for m in messages if fix in m)
        assert message.startswith("thread 't1'")
    assert all(w.filename == __file__ for w in warned if w.category is BlockingOnLoop)


def test_an_async_node_awaits_its_artifacts_and_plain_tools(env: Env) -> None:
    env.agent.delay("t2", how="awaited")
    result = env.agent.wait("t2", timeout=30)
    assert result["data"] == b"%PDF report"
    assert result["ref"]["content_type"] == "application/pdf"
    assert result["sent"] == "sent to b@example.com"
    assert env.sent == ["b@example.com"]
