"""A gevent worker on the SQLite store: a commit that waits for another process's write
lock (another worker's commit, a backup) must leave the worker's other greenlets running,
its control replies among them, and go through once the lock is gone."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import pytest

from agentq import Status
from tests.support.agents import Ledger, make_app
from tests.support.redis_server import RedisServer, wait_until
from tests.support.workers import WorkerProcess


@pytest.mark.timeout(120)
def test_a_commit_waiting_for_the_write_lock_leaves_the_worker_answering(
    redis_broker: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    pytest.importorskip("gevent")
    path = tmp_path / "agentq.db"
    prefix = f"sg{uuid.uuid4().hex[:8]}:"
    env = {
        "AGENTQ_TEST_BROKER": redis_broker,
        "AGENTQ_TEST_STORE": f"sqlite:///{path}",
        "AGENTQ_TEST_PREFIX": prefix,
        "AGENTQ_TEST_QUEUE": f"agentq-sqlite-gevent-{prefix}",
        "AGENTQ_TEST_LEDGER": redis_server.url,
        "AGENTQ_TEST_LEASE_TTL": "10",
    }
    app = make_app(
        broker=redis_broker,
        store=env["AGENTQ_TEST_STORE"],
        prefix=prefix,
        queue=env["AGENTQ_TEST_QUEUE"],
        ledger_url=redis_server.url,
        lease_ttl=10,
    )
    agent = app.tasks["tests.gated_agent"]
    ledger = Ledger(redis_server.url, prefix.rstrip(":"))
    worker = WorkerProcess(app, env, tmp_path, concurrency=10, pool="gevent").start()
    try:
        agent.delay("t1")
        wait_until(lambda: ledger.client.get(ledger.key("entered", "t1")), timeout=30)
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            ledger.client.rpush(ledger.key("go", "t1"), 1)
            wait_until(lambda: ledger.client.get(ledger.key("leaving", "t1")), timeout=30)
            # The node has returned: its commit waits for the lock this test holds.
            replies = app.control.ping(destination=[worker.name], timeout=5)
            assert replies == [{worker.name: {"ok": "pong"}}]
            assert agent.thread("t1").step == -1  # the commit has not gone through
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert agent.wait("t1", timeout=30) == "ok"
        assert agent.thread("t1").status == Status.DONE
    finally:
        worker.stop()
        app._agentq_runtime.store.close()
        app.close()
