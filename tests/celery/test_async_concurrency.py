"""Async nodes of many threads at once, on each kind of Celery pool: one event loop per
worker process, where their waits overlap; the store's calls stay in the pool's slots."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from tests.support.agents import make_app
from tests.support.redis_server import RedisServer
from tests.support.workers import WorkerProcess

NAP = 1.0
"""Seconds each of a thread's two async tool calls waits."""


class Setup:
    """An app on a private prefix and queue, and the environment a worker subprocess of
    it needs (:mod:`tests.support.worker_app`)."""

    def __init__(self, broker: str, server: RedisServer) -> None:
        prefix = f"ac{uuid.uuid4().hex[:8]}:"
        self.env = {
            "AGENTQ_TEST_BROKER": broker,
            "AGENTQ_TEST_STORE": server.url,
            "AGENTQ_TEST_PREFIX": prefix,
            "AGENTQ_TEST_QUEUE": f"agentq-async-{prefix}",
            "AGENTQ_TEST_LEDGER": server.url,
            "AGENTQ_TEST_LEASE_TTL": "10",
        }
        self.app: Celery = make_app(
            broker=broker,
            store=server.url,
            prefix=prefix,
            queue=self.env["AGENTQ_TEST_QUEUE"],
            ledger_url=server.url,
            lease_ttl=10,
        )
        self.agent: Any = self.app.tasks["tests.napping_agent"]

    def nap_all(self, threads: int) -> list[dict[str, Any]]:
        ids = [f"nap-{i}" for i in range(threads)]
        for thread_id in ids:
            self.agent.delay(thread_id, seconds=NAP)
        return [self.agent.wait(thread_id, timeout=90) for thread_id in ids]


@pytest.fixture
def setup(redis_broker: str, redis_server: RedisServer) -> Iterator[Setup]:
    made = Setup(redis_broker, redis_server)
    yield made
    made.app._agentq_runtime.store.close()
    made.app.close()


@pytest.fixture
def worker(setup: Setup, tmp_path: Path) -> Iterator[Any]:
    """Starts ``celery worker`` subprocesses of the app; stops them after the test."""
    started: list[WorkerProcess] = []

    def start(pool: str, concurrency: int, **env: str) -> WorkerProcess:
        process = WorkerProcess(
            setup.app, {**setup.env, **env}, tmp_path, concurrency=concurrency, pool=pool
        )
        started.append(process)
        return process.start()

    yield start
    for process in started:
        process.stop()


def assert_overlapping(results: list[dict[str, Any]]) -> None:
    """The naps ran at the same time: from the first start to the last end is far less
    than their sum, as it would be on a loop that ran one at a time."""
    naps = [nap for result in results for nap in result["naps"]]
    spent = sum(end - began for began, end in naps)
    assert spent >= len(naps) * NAP
    wall = max(end for _, end in naps) - min(began for began, _ in naps)
    assert wall < spent / 5, (wall, spent)


def one_loop_per_process(results: list[dict[str, Any]]) -> dict[int, set[int]]:
    loops: dict[int, set[int]] = {}
    for result in results:
        loops.setdefault(result["pid"], set()).add(result["loop"])
    assert all(len(ids) == 1 for ids in loops.values()), loops
    return loops


def test_fifty_threads_on_a_threads_pool_share_one_loop(setup: Setup) -> None:
    with start_worker(
        setup.app, pool="threads", concurrency=50, perform_ping_check=False, shutdown_timeout=30
    ):
        results = setup.nap_all(50)
    assert len(one_loop_per_process(results)) == 1
    assert_overlapping(results)


@pytest.mark.slow
def test_prefork_children_each_run_a_loop_of_their_own(setup: Setup, worker: Any) -> None:
    # The main process starts agentq's loop before forking its children.
    process = worker("prefork", 2, AGENTQ_TEST_LOOP_BEFORE_FORK="1")
    results = setup.nap_all(4)
    pids = set(one_loop_per_process(results))
    assert pids and all(process.owns(pid) and pid != process.pid for pid in pids)


@pytest.mark.slow
def test_fifty_threads_on_a_gevent_pool_wait_at_once(setup: Setup, worker: Any) -> None:
    pytest.importorskip("gevent")
    process = worker("gevent", 50)
    results = setup.nap_all(50)
    assert set(one_loop_per_process(results)) == {process.pid}
    assert_overlapping(results)
