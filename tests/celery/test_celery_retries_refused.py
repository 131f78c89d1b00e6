"""Celery's own retries, which would send the whole task again after its thread failed,
are refused with the way an agent retries a step: ``autoretry_for`` when the agent is
defined, ``self.retry()`` when a node calls it (the thread fails with that message, and
no second message is sent to find it failed)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

import agentq
from agentq import AgentTask, Done, Run, Status
from agentq.errors import InvalidArgument
from agentq.store.redis.store import RedisStore
from tests.support import autoretry_app
from tests.support.redis_server import RedisServer
from tests.support.workers import WorkerProcess


class Flaky(Exception):
    pass


def test_an_agent_class_with_autoretry_for_is_refused_with_retry_on() -> None:
    with pytest.raises(InvalidArgument, match=r"agent tests\.auto sets autoretry_for.*retry_on"):

        class AutoRetrying(AgentTask):
            name = "tests.auto"
            autoretry_for = (Flaky,)

            def start(self, run: Run) -> Any:
                return Done(None)


def test_a_function_agent_with_autoretry_for_is_refused_with_retry_on() -> None:
    app = Celery("refused", broker="memory://", set_as_current=False)
    with pytest.raises(InvalidArgument, match=r"agent tests\.fn sets autoretry_for.*retry_on"):
        agentq.agent(app, "tests.fn", autoretry_for=(Flaky,))
    assert "tests.fn" not in app.tasks
    app.close()


class SelfRetrying(AgentTask):
    name = "tests.self_retrying"

    def start(self, run: Run) -> Any:
        raise self.retry(countdown=1, max_retries=3)


@pytest.fixture
def app(redis_server: RedisServer) -> Iterator[Celery]:
    made = Celery("refused", broker="memory://", set_as_current=False)
    store = RedisStore.from_url(redis_server.url, prefix=f"rr{uuid.uuid4().hex[:8]}:")
    agentq.init_app(made, store=store)
    yield made
    store.close()
    made.close()


def test_self_retry_in_a_node_fails_the_thread_saying_to_use_retry_on(app: Celery) -> None:
    agent = app.register_task(SelfRetrying())
    agent.agentq.store.open_thread("t1", task=agent.name)
    with pytest.raises(InvalidArgument, match=r"Task\.retry\(\) would send the whole task"):
        agent.run("t1")
    meta = agent.thread("t1")
    assert meta.status == Status.FAILED
    assert meta.error is not None and "list its class in retry_on" in meta.error


def test_a_worker_refuses_to_start_with_an_agent_registered_with_autoretry_for(
    redis_broker: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    """``app.register_task(agent, autoretry_for=...)`` reaches no class: the worker refuses
    to start, as it refuses an unsafe store."""
    prefix = f"ar{uuid.uuid4().hex[:8]}:"
    env = {
        "AGENTQ_TEST_BROKER": redis_broker,
        "AGENTQ_TEST_STORE": redis_server.url,
        "AGENTQ_TEST_PREFIX": prefix,
        "AGENTQ_TEST_QUEUE": f"agentq-test-{prefix}",
    }
    app = autoretry_app.make(redis_broker, redis_server.url, prefix, env["AGENTQ_TEST_QUEUE"])
    worker = WorkerProcess(app, env, tmp_path, app_module="tests.support.autoretry_app")
    try:
        with pytest.raises(RuntimeError, match="worker exited with 1"):
            worker.start()
    finally:
        worker.stop()
        app.close()
    log = worker.log.read_text()
    assert "InvalidArgument: agent tests.registered_with_autoretry sets autoretry_for" in log
