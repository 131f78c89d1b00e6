"""A thread that stopped inside its first node, before any checkpoint, is at its entry
node: ``agentq threads``, ``agentq show`` and the inspector name it, on each store."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from click.testing import CliRunner
from starlette.testclient import TestClient

import agentq
from agentq import Done, Run, Status
from agentq.celery.function_agent import FunctionAgent
from agentq.cli import cli
from agentq.ui.app import create_app
from tests.support.redis_server import RedisServer, wait_until


@pytest.fixture(params=["redis", "sqlite"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'agentq.db'}"
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url


@pytest.fixture
def asking(redis_broker: str, store_url: str) -> Iterator[tuple[FunctionAgent, list[str]]]:
    prefix = f"fn{uuid.uuid4().hex[:8]}:"
    app = Celery("agentq-first-node", broker=redis_broker, set_as_current=False)
    app.conf.update(
        task_default_queue=f"agentq-test-{prefix}",
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    runtime = agentq.init_app(app, store=store_url, prefix=prefix)
    agent = agentq.agent(app, "tests.first_node", entry_node="ask")

    @agent.node
    def ask(run: Run) -> Any:
        return Done(run.interrupt({"question": "refund 10?"}))

    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False):
        agent.delay("t-asks")
        wait_until(
            lambda: agent.thread("t-asks").status == Status.WAITING, timeout=20, what="waiting"
        )
    yield agent, ["--store", store_url, "--prefix", prefix]
    runtime.store.close()
    app.close()


def test_a_thread_waiting_in_its_first_node_is_at_that_node(
    asking: tuple[FunctionAgent, list[str]],
) -> None:
    agent, where = asking
    meta = agent.thread("t-asks")
    assert meta.step == -1 and meta.node == "ask"
    listed = CliRunner().invoke(cli, [*where, "threads"], catch_exceptions=False).stdout
    row = next(line for line in listed.splitlines() if line.startswith("t-asks"))
    assert row.split()[:4] == ["t-asks", "waiting", "0", "ask"], listed
    shown = CliRunner().invoke(cli, [*where, "show", "t-asks"], catch_exceptions=False).stdout
    assert "0  (node ask; no checkpoint yet)" in shown, shown
    web = TestClient(create_app(agent.app._agentq_runtime.store), base_url="http://localhost")
    assert "(next node: ask; no checkpoint yet)" in web.get("/thread?id=t-asks").text
    assert "<td>ask</td>" in web.get("/").text
