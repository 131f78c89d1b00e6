"""The threads beside which a prefork worker's main process forks its pool's children.

Python 3.12+ warns at a ``fork()`` in a process that runs other threads (a child inherits
their locks as they were). The pool's first children are forked before agentq starts any
thread; a replacement child (``worker_max_tasks_per_child``, a child that died) is forked
beside the sweeper alone, which must run in the process that lives as long as the worker.
The lease keeper and the event loop run only in the children, which drive the threads.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.recovery.test_crash import Cluster
from tests.support.redis_server import RedisServer, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


@pytest.fixture
def cluster(redis_broker: str, redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    env = Cluster(redis_broker, redis_server, tmp_path)
    try:
        yield env
    finally:
        env.close()


def forks(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_the_pool_forks_beside_no_agentq_thread_but_the_sweeper(
    cluster: Cluster, tmp_path: Path
) -> None:
    log = tmp_path / "forks.jsonl"
    cluster.env["AGENTQ_TEST_FORK_LOG"] = str(log)
    cluster.env["AGENTQ_TEST_MAX_TASKS_PER_CHILD"] = "1"
    worker = cluster.worker()
    agent = cluster.agent("counting_agent")
    # Its last node is async: the child that runs it starts the event loop and the lease
    # keeper, then exits after its one task, and the worker forks a replacement.
    agent.delay("t1", n=2)
    assert agent.wait("t1", timeout=60) == 2
    wait_until(lambda: len(forks(log)) >= 2, timeout=30, what="a replacement pool child")

    first, *replacements = forks(log)
    assert {fork["pid"] for fork in forks(log)} == {worker.pid}
    assert first["threads"] == ["MainThread"]
    for fork in replacements:
        assert fork["threads"] == ["MainThread", "agentq-sweeper"]
