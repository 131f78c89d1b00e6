"""An async node runs on the event loop every async node of its worker process shares:
the blocking ``run.tool`` and ``run.artifacts.put``/``get`` are refused there, before
anything is claimed or stored, and their awaited forms make the store's round trips off
the loop."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

import agentq
from agentq import Done, FunctionAgent, Run, Status
from agentq.errors import ThreadStopped
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
            if how == "tool":
                return Done(run.tool(send, "a@example.com", key="email-1"))
            if how == "put":
                return Done(run.artifacts.put(b"report"))
            if how == "get":
                return Done(run.artifacts.get({"artifact": "0" * 64}))
            ref = await run.artifacts.aput(b"%PDF report", "application/pdf")
            sent = await run.atool(send, "b@example.com", key="email-2")
            return Done({"ref": ref, "data": await run.artifacts.aget(ref), "sent": sent})

    def failed(self, thread_id: str, how: str) -> str:
        self.agent.delay(thread_id, how=how)
        with pytest.raises(ThreadStopped):
            self.agent.wait(thread_id, timeout=30)
        meta = self.agent.thread(thread_id)
        assert meta.status == Status.FAILED
        assert meta.error is not None
        return meta.error


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


def test_run_tool_in_an_async_node_is_refused_before_its_claim(env: Env) -> None:
    error = env.failed("t1", "tool")
    assert "await run.atool(" in error and "step 0" in error and "t1" in error
    assert env.sent == []
    assert env.app._agentq_runtime.store.effect("t1", "email-1") is None


@pytest.mark.parametrize("how", ["put", "get"])
def test_blocking_artifact_calls_in_an_async_node_are_refused(env: Env, how: str) -> None:
    error = env.failed(f"t-{how}", how)
    assert f"await run.artifacts.a{how}(" in error


def test_an_async_node_awaits_its_artifacts_and_plain_tools(env: Env) -> None:
    env.agent.delay("t2", how="awaited")
    result = env.agent.wait("t2", timeout=30)
    assert result["data"] == b"%PDF report"
    assert result["ref"]["content_type"] == "application/pdf"
    assert result["sent"] == "sent to b@example.com"
    assert env.sent == ["b@example.com"]
