"""Killed, stopped and paused workers, on real ``celery worker`` subprocesses.

The store is a private redis-server with AOF always; the broker is the machine's Redis or
RabbitMQ (they redeliver differently). Recovery is the workers' own sweeper: no test
re-sends anything by hand.
"""

from __future__ import annotations

import contextlib
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from agentq import Status
from agentq.errors import ThreadStopped
from agentq.store.contract import Store
from tests.support.agents import Ledger, make_app
from tests.support.redis_server import RedisServer, wait_until
from tests.support.workers import WorkerProcess

# Each test kills or stops worker subprocesses and waits for another to take over: 4-16 s,
# more on a loaded machine, beyond the suite's default.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

# Each kind of broker the workers are recovered on, as the fixture giving a private one.
BROKERS = {"redis": "redis_broker", "rabbitmq": "rabbitmq_broker"}
LEASE_TTL = 2.0


class Cluster:
    """A store, a broker, and as many worker subprocesses as a test starts."""

    def __init__(self, broker: str, server: RedisServer, log_dir: Path) -> None:
        prefix = f"cr{uuid.uuid4().hex[:8]}:"
        self.env = {
            "AGENTQ_TEST_BROKER": broker,
            "AGENTQ_TEST_STORE": server.url,
            "AGENTQ_TEST_PREFIX": prefix,
            "AGENTQ_TEST_QUEUE": f"agentq-crash-{prefix}",
            "AGENTQ_TEST_LEDGER": server.url,
            "AGENTQ_TEST_LEASE_TTL": str(LEASE_TTL),
        }
        self.app: Celery = make_app(
            broker=broker,
            store=server.url,
            prefix=prefix,
            queue=self.env["AGENTQ_TEST_QUEUE"],
            ledger_url=server.url,
            lease_ttl=LEASE_TTL,
        )
        self.store: Store = self.app._agentq_runtime.store
        self.ledger = Ledger(server.url, prefix.rstrip(":"), self.store)
        self.log_dir = log_dir
        self.workers: list[WorkerProcess] = []

    def agent(self, name: str) -> Any:
        return self.app.tasks[f"tests.{name}"]

    def worker(self) -> WorkerProcess:
        worker = WorkerProcess(self.app, self.env, self.log_dir).start()
        self.workers.append(worker)
        return worker

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.app.close()


@pytest.fixture(params=list(BROKERS))
def cluster(
    request: pytest.FixtureRequest, redis_server: RedisServer, tmp_path: Path
) -> Iterator[Cluster]:
    broker: str = request.getfixturevalue(BROKERS[request.param])
    env = Cluster(broker, redis_server, tmp_path)
    try:
        yield env
    finally:
        env.close()


def reached(env: Cluster, thread_id: str, point: str) -> Callable[[], bool]:
    return lambda: env.ledger.reached(thread_id, point)


def assert_history_is_whole(store: Store, thread_id: str) -> None:
    steps = [c.step for c in store.history(thread_id, limit=1000)]
    assert steps == list(range(steps[0], steps[0] - len(steps), -1)), steps


@pytest.mark.parametrize("point", ["model", "tools_end"])
def test_sigkill_mid_node_resumes_on_another_worker(cluster: Cluster, point: str) -> None:
    agent = cluster.agent("support_agent")
    cluster.ledger.arm_crash("t1", point)
    first = cluster.worker()
    agent.delay("t1", question="refund please", refunds=1)
    wait_until(reached(cluster, "t1", point), timeout=30, what=f"crash point {point}")
    step_at_kill = agent.thread("t1").step
    first.kill()
    cluster.worker()
    assert agent.wait("t1", timeout=60) == "Refunded 10 EUR."
    assert agent.thread("t1").step == 3  # start, model, tools, model: same as uninterrupted
    assert step_at_kill < 3
    # an uninterrupted run makes 2 model calls; a crash costs at most one more
    assert cluster.ledger.model_calls("t1") <= 3
    assert cluster.ledger.tool_calls("t1") == cluster.ledger.as_sent("t1", {"call-refund-1": 1})
    assert cluster.ledger.effects("t1") == cluster.ledger.as_sent("t1", {"call-refund-1": "10"})
    assert_history_is_whole(cluster.store, "t1")


@pytest.mark.parametrize(
    "policy,status,tool_calls",
    [
        ("idempotent", Status.DONE, 2),
        ("reconcile", Status.DONE, 1),
        ("none", Status.NEEDS_ATTENTION, 1),
    ],
)
def test_sigkill_after_the_effect_before_its_record(
    cluster: Cluster, policy: str, status: Status, tool_calls: int
) -> None:
    agent = cluster.agent("support_agent")
    cluster.ledger.arm_crash("t1", "after_effect")
    first = cluster.worker()
    agent.delay("t1", question="refund please", refunds=1, policy=policy)
    wait_until(reached(cluster, "t1", "after_effect"), timeout=30, what="the refund")
    first.kill()
    cluster.worker()
    with contextlib.suppress(ThreadStopped):
        agent.wait("t1", timeout=60)
    meta = agent.thread("t1")
    assert meta.status == status, meta.error
    # The payment service applied the refund exactly once, whatever the policy.
    assert cluster.ledger.effects("t1") == cluster.ledger.as_sent("t1", {"call-refund-1": "10"})
    assert cluster.ledger.tool_calls("t1") == cluster.ledger.as_sent(
        "t1", {"call-refund-1": tool_calls}
    )
    if status == Status.NEEDS_ATTENTION:
        assert "call-refund-1" in (meta.error or "")


@pytest.mark.timeout(120)  # 20 steps of 0.5 s around a warm shutdown: 16 s unloaded
def test_sigterm_hands_the_thread_over_within_one_step(cluster: Cluster) -> None:
    agent = cluster.agent("counting_agent")
    first = cluster.worker()
    agent.delay("t1", n=20, slow=0.5)
    wait_until(lambda: agent.thread("t1").step >= 2, timeout=30, what="two steps")
    first.terminate()
    first.wait_exit(timeout=10)  # a step is 0.5 s: the worker leaves well before the run ends
    meta = agent.thread("t1")
    assert meta.status == Status.QUEUED and meta.step < 19, meta
    cluster.worker()
    assert agent.wait("t1", timeout=60) == 20
    assert int(cluster.ledger.client.get(cluster.ledger.key("steps", "t1"))) <= 21
    assert_history_is_whole(cluster.store, "t1")


def test_a_paused_worker_is_fenced_out_after_takeover(cluster: Cluster) -> None:
    agent = cluster.agent("counting_agent")
    zombie = cluster.worker()
    agent.delay("t1", n=12, slow=0.3)
    wait_until(lambda: agent.thread("t1").step >= 1, timeout=30, what="a step")
    zombie.signal_group(signal.SIGSTOP)
    fence = agent.thread("t1").fence
    cluster.worker()
    wait_until(lambda: agent.thread("t1").fence > fence, timeout=30, what="takeover")
    zombie.signal_group(signal.SIGCONT)
    assert agent.wait("t1", timeout=60) == 12
    assert_history_is_whole(cluster.store, "t1")
    assert cluster.store.latest("t1").token > fence  # type: ignore[union-attr]


def test_a_thread_that_keeps_killing_its_worker_fails(cluster: Cluster) -> None:
    agent = cluster.agent("support_agent")
    cluster.ledger.client.set(cluster.ledger.key("crash-always", "t1"), "model")
    agent.delay("t1", question="boom", refunds=0)
    kills = 0
    deadline = time.monotonic() + 120
    while agent.thread("t1").status != Status.FAILED:
        assert time.monotonic() < deadline, "thread did not fail"
        calls = cluster.ledger.model_calls("t1")
        worker = cluster.worker()
        try:
            wait_until(
                lambda before=calls: (
                    cluster.ledger.model_calls("t1") > before
                    or agent.thread("t1").status == Status.FAILED
                ),
                timeout=30,
                what="the model call",
            )
        finally:
            worker.kill()
        kills += 1
    meta = agent.thread("t1")
    assert "worker lost 3 times at step 1" in (meta.error or ""), meta.error
    assert kills <= 5
