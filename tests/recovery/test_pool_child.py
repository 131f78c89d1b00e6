"""A prefork pool child killed under its worker (the OOM killer picks the biggest process,
the child running the step), and children recycled by ``worker_max_tasks_per_child``.

The worker's main process lives on: it sees ``WorkerLostError`` and, since ``AgentTask``
sets ``acks_late`` and ``reject_on_worker_lost``, requeues the message at once, while the
dead child's lease still holds the thread. The redelivered message must leave the thread
to its lease (not fail it, not run it beside nobody), and recovery resumes it once, when
the lease runs out, counting one lost worker.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery.result import AsyncResult

from agentq import Status
from tests.recovery.test_crash import BROKERS, Cluster, assert_history_is_whole, reached
from tests.support.redis_server import RedisServer, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


@pytest.fixture(params=list(BROKERS))
def cluster(
    request: pytest.FixtureRequest, redis_server: RedisServer, tmp_path: Path
) -> Iterator[Cluster]:
    # Each broker requeues the lost child's message its own way.
    broker: str = request.getfixturevalue(BROKERS[request.param])
    env = Cluster(broker, redis_server, tmp_path)
    # The tasks' states, which a test reads for what the caller of delay() sees.
    env.env["AGENTQ_TEST_BACKEND"] = env.app.conf.result_backend = redis_server.url[:-1] + "1"
    try:
        yield env
    finally:
        env.close()


def lease_holder_pid(env: Cluster, thread_id: str) -> int | None:
    """The process that holds the thread's lease (its owner is ``host:pid:random``)."""
    (schedule,) = env.store.schedules([thread_id])
    if schedule.owner is None:
        return None
    return int(schedule.owner.split(":")[1])


def kill_child(env: Cluster, thread_id: str, main_pid: int) -> int:
    """SIGKILL the pool child driving the thread, never the worker's main process."""
    pid = lease_holder_pid(env, thread_id)
    assert pid is not None and pid != main_pid, (pid, main_pid)
    os.kill(pid, signal.SIGKILL)
    return pid


def test_a_killed_pool_child_resumes_once(cluster: Cluster) -> None:
    agent = cluster.agent("support_agent")
    cluster.ledger.arm_crash("t1", "model")
    worker = cluster.worker()
    first = agent.delay("t1", question="refund please", refunds=1)
    wait_until(reached(cluster, "t1", "model"), timeout=30, what="the first model call")
    fence = agent.thread("t1").fence
    kill_child(cluster, "t1", worker.pid)

    assert agent.wait("t1", timeout=60) == "Refunded 10 EUR."
    assert worker.running  # only the child died: the same worker carried the thread on
    meta = agent.thread("t1")
    assert meta.step == 3  # start, model, tools, model: as uninterrupted
    # Taken once after the kill: the redelivered message left the thread to its lease,
    # then one message took it (a second driver would have raised the fence again).
    assert meta.fence == fence + 1, (meta.fence, fence)
    assert cluster.ledger.model_calls("t1") == 3  # the killed one, then two
    assert cluster.ledger.tool_calls("t1") == cluster.ledger.as_sent("t1", {"call-refund-1": 1})
    assert cluster.ledger.effects("t1") == cluster.ledger.as_sent("t1", {"call-refund-1": "10"})
    assert_history_is_whole(cluster.store, "t1")
    # The first task's result is the thread's, not the lost worker's failure.
    wait_until(lambda: first.state == "SUCCESS", timeout=30, what="the first task's result")
    assert first.get(timeout=5) == "Refunded 10 EUR."


def test_a_step_that_keeps_killing_its_pool_child_fails_after_max_crashes(
    cluster: Cluster,
) -> None:
    """Each kill is seen twice (the requeued message and recovery's): counted once."""
    agent = cluster.agent("support_agent")
    cluster.ledger.client.set(cluster.ledger.key("crash-always", "t1"), "model")
    worker = cluster.worker()
    first = agent.delay("t1", question="boom", refunds=0)
    kills = 0
    deadline = time.monotonic() + 80
    while agent.thread("t1").status != Status.FAILED:
        assert time.monotonic() < deadline, "thread did not fail"
        calls = cluster.ledger.model_calls("t1")
        wait_until(
            lambda before=calls: (
                cluster.ledger.model_calls("t1") > before
                or agent.thread("t1").status == Status.FAILED
            ),
            timeout=30,
            what="the model call",
        )
        if agent.thread("t1").status == Status.FAILED:
            break
        wait_until(
            lambda: reached(cluster, "t1", "model")() and lease_holder_pid(cluster, "t1"),
            timeout=30,
            what="the blocked model call",
        )
        kill_child(cluster, "t1", worker.pid)
        kills += 1
    meta = agent.thread("t1")
    assert "worker lost 3 times at step 1" in (meta.error or ""), meta.error
    assert kills == 3
    assert cluster.ledger.model_calls("t1") == 3
    assert worker.running
    # The thread failed: its first task says so, rather than waiting forever.
    wait_until(lambda: first.state == "FAILURE", timeout=30, what="the first task's failure")
    with contextlib.suppress(Exception):
        first.get(timeout=1, propagate=False)
    assert "worker lost 3 times" in str(first.result), first.result


def test_children_recycled_after_every_task_lose_nothing(
    cluster: Cluster, redis_server: RedisServer
) -> None:
    """``worker_max_tasks_per_child=1``: a fresh child per message, so every hand-over,
    redelivery and resend runs in a process that has never seen the thread."""
    cluster.env["AGENTQ_TEST_MAX_TASKS_PER_CHILD"] = "1"
    agent = cluster.agent("counting_agent")
    worker = cluster.worker()
    results: dict[str, AsyncResult] = {
        f"t{i}": agent.delay(f"t{i}", n=4, slow=0.05) for i in range(3)
    }
    for thread_id in results:
        assert agent.wait(thread_id, timeout=60) == 4
        assert_history_is_whole(cluster.store, thread_id)
        assert int(cluster.ledger.client.get(cluster.ledger.key("steps", thread_id))) == 4
        assert agent.thread(thread_id).fence == 1
    for result in results.values():
        assert result.get(timeout=10) == 4
    # A run split over tasks (a 429 retried after its Retry-After) goes on in the next
    # child from the checkpoint the recycled one committed.
    support = cluster.agent("support_agent")
    support.delay("r1", question="refund", refunds=1, rate_limits=1, retry_after=0)
    assert support.wait("r1", timeout=60) == "Refunded 10 EUR."
    assert cluster.ledger.model_calls("r1") == 3  # the 429, then two
    assert cluster.ledger.tool_calls("r1") == cluster.ledger.as_sent("r1", {"call-refund-1": 1})
    assert worker.running


def test_a_killed_main_process_loses_nothing(cluster: Cluster) -> None:
    """The OOM killer's other choice: the worker's main process alone. Its pool child
    dies with it (billiard's parent-death signal) or runs on orphaned under its lease;
    either way the worker started in its place ends the thread once, the step in flight
    run at most once more."""
    agent = cluster.agent("counting_agent")
    worker = cluster.worker()
    agent.delay("t1", n=12, slow=0.3)
    wait_until(lambda: agent.thread("t1").step >= 1, timeout=30, what="a step")
    child = lease_holder_pid(cluster, "t1")
    assert child is not None and child != worker.pid
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait_exit(timeout=10)
    cluster.worker()
    assert agent.wait("t1", timeout=60) == 12
    assert 12 <= int(cluster.ledger.client.get(cluster.ledger.key("steps", "t1"))) <= 13
    assert_history_is_whole(cluster.store, "t1")
