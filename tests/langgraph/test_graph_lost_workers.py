"""Workers lost at different super-steps of one graph run are counted per super-step, as
they are per node of an agent: real ``celery worker`` subprocesses, SIGKILLed."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import redis

from agentq.langgraph import GraphTask
from tests.support.crashy_graph_app import CRASHY, make_app
from tests.support.redis_server import RedisServer, wait_until
from tests.support.workers import WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_workers_lost_at_three_different_super_steps_do_not_fail_the_thread(
    redis_broker: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Each SIGKILL loses only the super-step in flight and the next worker gets past it;
    three lost workers at three different nodes are not "a step that kills its worker
    every time" (max_crashes=3)."""
    prefix = f"cg{uuid.uuid4().hex[:8]}:"
    env = {
        "AGENTQ_TEST_BROKER": redis_broker,
        "AGENTQ_TEST_STORE": redis_server.url,
        "AGENTQ_TEST_PREFIX": prefix,
        "AGENTQ_TEST_QUEUE": f"agentq-test-{prefix}",
        "AGENTQ_TEST_LEDGER": redis_server.url,
        "AGENTQ_TEST_LEASE_TTL": "2",
    }
    app = make_app(
        broker=redis_broker,
        store=redis_server.url,
        prefix=prefix,
        queue=env["AGENTQ_TEST_QUEUE"],
        ledger_url=redis_server.url,
        lease_ttl=2,
    )
    task: GraphTask = app.tasks[CRASHY]
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    ns = prefix.rstrip(":")
    workers: list[WorkerProcess] = []

    def worker() -> WorkerProcess:
        w = WorkerProcess(app, env, tmp_path, app_module="tests.support.crashy_graph_app").start()
        workers.append(w)
        return w

    try:
        current = worker()
        task.delay("c1", {"log": []})
        for name in ("k1", "k2", "k3"):
            wait_until(
                lambda name=name: client.exists(f"{ns}:reached:c1:{name}"), timeout=40, what=name
            )
            current.kill()
            current = worker()
        meta = task.thread("c1")
        result = task.wait("c1", timeout=40)
        assert result["log"] == ["k1", "k2", "k3", "k4"], meta
    finally:
        for w in workers:
            w.stop()
        client.close()
        app.close()
