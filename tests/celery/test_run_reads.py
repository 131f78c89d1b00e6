"""What a task run reads from the store, counted by the store's own server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

import agentq
from agentq import AgentTask, Done, Run, Status
from agentq.store.redis.store import RedisStore
from tests.support.redis_server import RedisServer


class TwoSteps(AgentTask):
    name = "tests.reads.two_steps"

    def start(self, run: Run) -> str:
        run.state["n"] = 1
        return "finish"

    def finish(self, run: Run) -> Any:
        return Done(run.state["n"] + 1)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "store").start()
    yield server
    server.stop()


class CountingConnection(redis.Connection):
    """A connection that counts the requests it writes: one per round trip."""

    sent = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        type(self).sent += 1
        super().send_packed_command(command, check_health)


def test_a_run_that_finishes_its_thread_reads_the_meta_only_to_start(server: RedisServer) -> None:
    pool = redis.ConnectionPool(port=server.port, connection_class=CountingConnection)
    store = RedisStore(redis.Redis(connection_pool=pool))
    app = Celery("reads", broker="memory://", set_as_current=False)
    agentq.init_app(app, store=store)
    agent: TwoSteps = app.register_task(TwoSteps())
    counter = redis.Redis(port=server.port)
    try:
        for thread_id in ("t0", "t1"):
            store.open_thread(thread_id, task=agent.name)
        assert agent.run("t0") == 2  # loads the scripts
        counter.config_resetstat()
        CountingConnection.sent = 0
        assert agent.run("t1") == 2
        reads = counter.info("commandstats").get("cmdstat_hgetall", {}).get("calls", 0)
        # Only in the script that takes the lease: the end needs none, the driver knows
        # what its last commit wrote.
        assert reads == 1
        # Taking the lease with the meta, and a commit per step (the last one also ends
        # the thread and gives the lease up).
        assert CountingConnection.sent == 3
        meta = store.meta("t1")
        assert meta is not None and meta.status == Status.DONE and meta.result == 2
    finally:
        counter.close()
        store.close()
        app.close()
