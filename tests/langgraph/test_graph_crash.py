"""A LangGraph graph on real ``celery worker`` subprocesses that are SIGKILLed mid-graph.

The store is the session's private redis-server (AOF always); the broker is the machine's
Redis. Recovery is the workers' own sweeper: no test re-sends anything by hand.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery

from agentq import Status
from agentq.errors import ThreadStopped
from agentq.langgraph import GraphTask
from agentq.store.contract import Store
from tests.support.agents import Ledger
from tests.support.graphs import (
    ASYNC_TOOLS_GRAPH_TASK,
    GRAPH_TASK,
    TYPED_GRAPH_TASK,
    Order,
    make_graph_app,
    question,
)
from tests.support.redis_server import RedisServer, wait_until
from tests.support.workers import WorkerProcess

# Each test kills or stops worker subprocesses and waits for another to take over: 4-16 s,
# more on a loaded machine, beyond the suite's default.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]
LEASE_TTL = 2.0


class Cluster:
    """A store, a broker, and graph workers as subprocesses."""

    def __init__(self, broker: str, server: RedisServer, log_dir: Path) -> None:
        prefix = f"gc{uuid.uuid4().hex[:8]}:"
        self.env = {
            "AGENTQ_TEST_BROKER": broker,
            "AGENTQ_TEST_STORE": server.url,
            "AGENTQ_TEST_PREFIX": prefix,
            "AGENTQ_TEST_QUEUE": f"agentq-graph-crash-{prefix}",
            "AGENTQ_TEST_LEDGER": server.url,
            "AGENTQ_TEST_LEASE_TTL": str(LEASE_TTL),
        }
        self.app: Celery = make_graph_app(
            broker=broker,
            store=server.url,
            prefix=prefix,
            queue=self.env["AGENTQ_TEST_QUEUE"],
            ledger_url=server.url,
            lease_ttl=LEASE_TTL,
        )
        self.task: GraphTask = self.app.tasks[GRAPH_TASK]
        self.store: Store = self.app._agentq_runtime.store
        self.ledger = Ledger(server.url, prefix.rstrip(":"), self.store)
        self.log_dir = log_dir
        self.workers: list[WorkerProcess] = []

    def worker(self) -> WorkerProcess:
        worker = WorkerProcess(
            self.app, self.env, self.log_dir, app_module="tests.support.graph_worker_app"
        ).start()
        self.workers.append(worker)
        return worker

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.app.close()


@pytest.fixture
def cluster(redis_broker: str, redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    env = Cluster(redis_broker, redis_server, tmp_path)
    try:
        yield env
    finally:
        env.close()


def assert_one_checkpoint_chain(env: Cluster, thread_id: str) -> None:
    """Every LangGraph checkpoint's parent is the one before it: no fork."""
    history = list(env.task.saver.list({"configurable": {"thread_id": thread_id}}))
    ids = [t.config["configurable"]["checkpoint_id"] for t in history]
    parents = [
        t.parent_config["configurable"]["checkpoint_id"] if t.parent_config else None
        for t in history
    ]
    assert parents == [*ids[1:], None]
    assert [t.metadata["step"] for t in history] == list(range(len(history) - 2, -2, -1))


@pytest.mark.parametrize("point", ["model", "tools_end"])
def test_sigkill_mid_graph_resumes_and_refunds_once(cluster: Cluster, point: str) -> None:
    cluster.ledger.arm_crash("t1", point)
    first = cluster.worker()
    cluster.task.delay("t1", question("refund please"))
    wait_until(lambda: cluster.ledger.reached("t1", point), timeout=30, what=f"crash point {point}")
    first.kill()
    cluster.worker()
    result = cluster.task.wait("t1", timeout=60)
    assert result["messages"][-1]["content"] == "Refunded 10 EUR."
    # an uninterrupted run makes 2 model calls; a crash costs at most the one in flight
    assert cluster.ledger.model_calls("t1") <= 3
    assert cluster.ledger.tool_calls("t1") == cluster.ledger.as_sent("t1", {"call-refund-1": 1})
    assert cluster.ledger.effects("t1") == cluster.ledger.as_sent("t1", {"call-refund-1": "10"})
    assert [m["type"] for m in result["messages"]] == ["human", "ai", "tool", "ai"]
    assert_one_checkpoint_chain(cluster, "t1")
    assert cluster.task.thread("t1").fence >= 2  # the second worker took the lease over


@pytest.mark.parametrize(
    "policy,status,tool_calls",
    [
        ("idempotent", Status.DONE, 2),
        ("reconcile", Status.DONE, 1),
        ("none", Status.NEEDS_ATTENTION, 1),
    ],
)
# The refund is a plain function under tool_call, or an async def one under atool_call.
@pytest.mark.parametrize("name", [GRAPH_TASK, ASYNC_TOOLS_GRAPH_TASK], ids=["sync", "async"])
def test_sigkill_between_the_refund_and_its_record(
    cluster: Cluster, name: str, policy: str, status: Status, tool_calls: int
) -> None:
    task: GraphTask = cluster.app.tasks[name]
    cluster.ledger.arm_crash("t1", "after_effect")
    first = cluster.worker()
    task.delay("t1", question("refund please", policy=policy))
    wait_until(lambda: cluster.ledger.reached("t1", "after_effect"), timeout=30, what="the refund")
    first.kill()
    cluster.worker()
    with contextlib.suppress(ThreadStopped):
        task.wait("t1", timeout=60)
    meta = task.thread("t1")
    assert meta.status == status, meta.error
    # The payment service applied the refund exactly once, whatever the policy.
    assert cluster.ledger.effects("t1") == cluster.ledger.as_sent("t1", {"call-refund-1": "10"})
    assert cluster.ledger.tool_calls("t1") == cluster.ledger.as_sent(
        "t1", {"call-refund-1": tool_calls}
    )


def test_sigkill_while_resuming_an_interrupt(cluster: Cluster) -> None:
    first = cluster.worker()
    cluster.task.delay("t1", question("refund?", approval=True))
    wait_until(
        lambda: cluster.task.thread("t1").status == Status.WAITING, timeout=30, what="waiting"
    )
    cluster.ledger.arm_crash("t1", "tools_end")
    cluster.task.resume("t1", {"approved": True})
    wait_until(
        lambda: cluster.ledger.reached("t1", "tools_end"),
        timeout=30,
        what="the tools after the resume",
    )
    first.kill()
    cluster.worker()
    result = cluster.task.wait("t1", timeout=60)
    assert result["messages"][-1]["content"] == "Refunded 10 EUR."
    assert result["approved"] is True
    assert cluster.ledger.tool_calls("t1") == cluster.ledger.as_sent("t1", {"call-refund-1": 1})
    assert_one_checkpoint_chain(cluster, "t1")


def test_a_worker_started_after_a_crash_reads_the_states_objects_back(cluster: Cluster) -> None:
    task: GraphTask = cluster.app.tasks[TYPED_GRAPH_TASK]
    first = cluster.worker()
    task.delay("o1", {"order": Order(number="A-1", total=30)})
    wait_until(lambda: task.thread("o1").status == Status.WAITING, timeout=30, what="waiting")
    cluster.ledger.arm_crash("o1", "confirm")
    task.resume("o1", True)
    wait_until(lambda: cluster.ledger.reached("o1", "confirm"), timeout=30, what="the resume")
    first.kill()
    cluster.worker()  # a new process: it has written none of these objects
    # The resumed node records the types it read from the checkpoint.
    assert task.wait("o1", timeout=60)["revived"] == ["Order", "Refund"]
    assert task.thread("o1").fence >= 2


@pytest.mark.timeout(120)  # slow steps around a warm shutdown: 16 s unloaded
def test_sigterm_hands_the_graph_over_within_one_step(cluster: Cluster) -> None:
    first = cluster.worker()
    cluster.task.delay("t1", question("refund a lot", refunds=8, slow=0.5))
    wait_until(lambda: cluster.ledger.model_calls("t1") >= 2, timeout=30, what="two steps")
    first.terminate()
    first.wait_exit(timeout=15)  # a step is ~0.5 s: the worker leaves long before the run ends
    meta = cluster.task.thread("t1")
    assert meta.status == Status.QUEUED, meta
    assert cluster.ledger.model_calls("t1") < 9
    cluster.worker()
    result = cluster.task.wait("t1", timeout=90)
    assert result["messages"][-1]["content"] == "Refunded 80 EUR."
    assert cluster.ledger.tool_calls("t1") == cluster.ledger.as_sent(
        "t1", {f"call-refund-{i}": 1 for i in range(1, 9)}
    )
    assert cluster.ledger.model_calls("t1") <= 10  # 9 in a run, plus at most the one cut
    assert_one_checkpoint_chain(cluster, "t1")
