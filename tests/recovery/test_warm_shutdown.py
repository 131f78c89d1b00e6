"""Shutdowns of a worker holding many threads at once, on real ``celery worker``
subprocesses: a warm shutdown (SIGTERM) under ``-P threads`` and ``-P gevent``, where one
process drives every thread, a cold one (SIGQUIT), and a main process stopped and
continued (SIGSTOP/SIGCONT).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery.result import AsyncResult

from agentq import Status
from tests.recovery.test_crash import Cluster, assert_history_is_whole
from tests.support.redis_server import RedisServer, wait_until
from tests.support.workers import WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

THREADS = 20
STEPS = 8
SLOW = 0.3
"""Seconds each counting step blocks on the ledger: SIGTERM lands mid-step."""
LONG = 40
"""Steps of a thread that outlasts a soft shutdown's wait many times over."""


@pytest.fixture
def cluster(redis_broker: str, redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    env = Cluster(redis_broker, redis_server, tmp_path)
    env.env["AGENTQ_TEST_BACKEND"] = env.app.conf.result_backend = redis_server.url[:-1] + "1"
    try:
        yield env
    finally:
        env.close()


def start_worker(env: Cluster, pool: str, concurrency: int) -> WorkerProcess:
    # The chaos app gives the broker connections enough for every pool slot to ack.
    worker = WorkerProcess(
        env.app,
        {**env.env, "AGENTQ_TEST_CONCURRENCY": str(concurrency)},
        env.log_dir,
        pool=pool,
        concurrency=concurrency,
        app_module="tests.chaos.worker_app",
    ).start()
    env.workers.append(worker)
    return worker


def steps_run(env: Cluster, thread_id: str) -> int:
    return int(env.ledger.client.get(env.ledger.key("steps", thread_id)) or 0)


def start_threads(env: Cluster, count: int = THREADS, n: int = STEPS) -> dict[str, AsyncResult]:
    agent = env.agent("counting_agent")
    sent = {f"t{i}": agent.delay(f"t{i}", n=n, slow=SLOW) for i in range(count)}
    wait_until(
        lambda: all(steps_run(env, t) >= 1 for t in sent),
        timeout=60,
        what="every thread in flight",
    )
    return sent


def finish_and_check(
    env: Cluster, sent: dict[str, AsyncResult], *, repeated: int, n: int = STEPS
) -> None:
    """Every thread ends with its count, having run each step once (``repeated`` more:
    the steps in flight a lost worker may run again), and its first task holds it."""
    agent = env.agent("counting_agent")
    for thread_id, first in sent.items():
        assert agent.wait(thread_id, timeout=90) == n
        assert n <= steps_run(env, thread_id) <= n + repeated, thread_id
        assert_history_is_whole(env.store, thread_id)
        wait_until(lambda r=first: r.state == "SUCCESS", timeout=30, what=f"{thread_id}'s task")
        assert first.result == n


@pytest.mark.parametrize("pool", ["threads", "gevent"])
def test_sigterm_hands_every_thread_over(cluster: Cluster, pool: str) -> None:
    old = start_worker(cluster, pool, THREADS)
    sent = start_threads(cluster)
    old.terminate()
    assert old.wait_exit(timeout=60) == 0
    agent = cluster.agent("counting_agent")
    for thread_id in sent:
        meta = agent.thread(thread_id)
        # Handed over (or, for one that had its last step in flight, finished): none
        # failed, none left running under a lease for recovery to find.
        assert meta.status in (Status.QUEUED, Status.DONE), (thread_id, meta)
        (schedule,) = cluster.store.schedules([thread_id])
        assert schedule.owner is None, (thread_id, schedule)
    assert any(agent.thread(t).status == Status.QUEUED for t in sent)
    start_worker(cluster, pool, THREADS)
    finish_and_check(cluster, sent, repeated=0)
    for thread_id in sent:
        assert agent.thread(thread_id).crashes == 0


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_sigquit_loses_no_thread(cluster: Cluster, pool: str) -> None:
    """A cold shutdown stops the tasks where they are: each thread runs on from its last
    commit on another worker, having run the step in flight at most once more."""
    concurrency = 2 if pool == "prefork" else THREADS
    old = start_worker(cluster, pool, concurrency)
    sent = start_threads(cluster, concurrency)
    os.kill(old.pid, signal.SIGQUIT)
    old.wait_exit(timeout=60)
    # The cold shutdown ran to its end: no pool process outlives it, and agentq's
    # hand-over, asked of a pool Celery stopped already, raised nothing into it.
    wait_until(lambda: not group_alive(old), timeout=30, what="the pool processes' exit")
    assert "relay_drain" not in old.log.read_text(errors="replace")
    start_worker(cluster, pool, concurrency)
    finish_and_check(cluster, sent, repeated=1)


def group_alive(worker: WorkerProcess) -> bool:
    try:
        os.killpg(worker.pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_sigquit_with_a_soft_shutdown_hands_threads_over(cluster: Cluster, pool: str) -> None:
    """``worker_soft_shutdown_timeout`` gives running tasks time before a cold shutdown
    cancels them: the agents hand their threads over in it, as on SIGTERM, rather than
    run on until they are cut off mid-step and taken for lost workers."""
    cluster.env["AGENTQ_TEST_SOFT_SHUTDOWN"] = "2"
    concurrency = 2 if pool == "prefork" else THREADS
    old = start_worker(cluster, pool, concurrency)
    # Runs far longer than the soft shutdown's wait: none ends in it by itself.
    sent = start_threads(cluster, concurrency, LONG)
    os.kill(old.pid, signal.SIGQUIT)
    old.wait_exit(timeout=60)
    agent = cluster.agent("counting_agent")
    for thread_id in sent:
        meta = agent.thread(thread_id)
        assert meta.status == Status.QUEUED, (thread_id, meta)
        (schedule,) = cluster.store.schedules([thread_id])
        assert schedule.owner is None, (thread_id, schedule)
    start_worker(cluster, pool, concurrency)
    finish_and_check(cluster, sent, repeated=0, n=LONG)


def test_a_stopped_main_process_continued_loses_nothing(cluster: Cluster) -> None:
    """SIGSTOP of the main process only: its pool child goes on committing, the lease
    keeper with it, and nobody else takes the thread; the worker answers again after
    SIGCONT and the thread ends once."""
    worker = start_worker(cluster, "prefork", 1)
    agent = cluster.agent("counting_agent")
    first = agent.delay("t0", n=STEPS, slow=SLOW)
    wait_until(lambda: steps_run(cluster, "t0") >= 1, timeout=30, what="a step")
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        wait_until(
            lambda: agent.thread("t0").status == Status.DONE, timeout=60, what="the thread's end"
        )
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    assert agent.thread("t0").fence == 1
    assert steps_run(cluster, "t0") == STEPS
    wait_until(lambda: first.state == "SUCCESS", timeout=30, what="the task's result")


def test_sigterm_to_the_whole_group_loses_no_thread(cluster: Cluster) -> None:
    """SIGTERM to every process of a prefork worker (a container runtime or systemd
    ``KillMode=control-group``): the children get it too, mid-step."""
    old = start_worker(cluster, "prefork", 2)
    sent = start_threads(cluster, 2)
    old.signal_group(signal.SIGTERM)
    old.wait_exit(timeout=60)
    agent = cluster.agent("counting_agent")
    for thread_id in sent:
        assert agent.thread(thread_id).status != Status.FAILED, agent.thread(thread_id)
    start_worker(cluster, "prefork", 2)
    finish_and_check(cluster, sent, repeated=1)


def test_sigterm_hands_async_threads_over_on_gevent(cluster: Cluster) -> None:
    """``async def`` nodes on agentq's event loop, each awaiting a tool under its claim:
    a warm shutdown lets each node and its call finish before the thread is handed over."""
    old = start_worker(cluster, "gevent", THREADS)
    agent = cluster.agent("napping_agent")
    sent = {f"n{i}": agent.delay(f"n{i}", seconds=1.0) for i in range(THREADS)}
    wait_until(
        lambda: all(cluster.store.effect(t, "first") is not None for t in sent),
        timeout=60,
        what="every first nap claimed",
    )
    old.terminate()
    assert old.wait_exit(timeout=60) == 0
    for thread_id in sent:
        meta = agent.thread(thread_id)
        assert meta.status in (Status.QUEUED, Status.DONE), (thread_id, meta)
    start_worker(cluster, "gevent", THREADS)
    for thread_id, first in sent.items():
        result = agent.wait(thread_id, timeout=90)
        assert len(result["naps"]) == 2
        assert_history_is_whole(cluster.store, thread_id)
        wait_until(lambda r=first: r.state == "SUCCESS", timeout=30, what=f"{thread_id}'s task")
