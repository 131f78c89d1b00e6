"""A hard ``time_limit`` fails the thread as it fails the task: the first task ends
``FAILURE`` with ``TimeLimitExceeded`` and runs its errbacks, and recovery does not run the
thread again (which would finish it, turn its first task to ``SUCCESS`` and run its
callbacks after its errbacks). Real workers: prefork's pool kills the child, gevent's
raises in the greenlet."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded

from agentq import Status
from tests.support import time_limit_app
from tests.support.redis_server import RedisServer, wait_until
from tests.support.workers import WorkerProcess


@pytest.fixture
def ledger(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    client.close()


@pytest.mark.parametrize("slow_at", [0, 1], ids=["a step", "the last step"])
def test_a_soft_time_limit_during_a_step_report_fails_a_thread_that_goes_on(
    slow_at: int,
    redis_server: RedisServer,
    redis_broker: str,
    result_backend: str,
    tmp_path: Path,
) -> None:
    """The soft limit's signal may land while the driver reports a committed step (a slow
    result backend or progress hook), whose own errors are only logged: it fails the
    thread and its task all the same, rather than be taken for a failed report. After
    the step that ended the thread there is nothing left to stop: it stays done."""
    prefix = f"sl{uuid.uuid4().hex[:8]}"
    env = {
        "AGENTQ_TEST_BROKER": redis_broker,
        "AGENTQ_TEST_BACKEND": result_backend,
        "AGENTQ_TEST_STORE": redis_server.url,
        "AGENTQ_TEST_LEDGER": redis_server.url,
        "AGENTQ_TEST_PREFIX": prefix,
        "AGENTQ_TEST_QUEUE": f"agentq-test-{prefix}",
    }
    app = time_limit_app.make(
        redis_broker, result_backend, redis_server.url, prefix + ":", env["AGENTQ_TEST_QUEUE"]
    )
    agent = app.tasks["tests.slow_report"]
    worker = WorkerProcess(app, env, tmp_path, app_module="tests.support.time_limit_app").start()
    try:
        first = agent.delay("t1", slow_at=slow_at)
        if slow_at == 1:
            assert first.get(timeout=60) == "finished"
            assert agent.thread("t1").status == Status.DONE
            return
        wait_until(
            lambda: agent.thread("t1").status in (Status.FAILED, Status.DONE),
            timeout=60,
            what="the thread to end",
        )
        meta = agent.thread("t1")
        assert meta.status == Status.FAILED, meta.status
        assert meta.step == 0  # the step whose report was cut short stays committed
        assert meta.error is not None and "SoftTimeLimitExceeded" in meta.error
        with pytest.raises(SoftTimeLimitExceeded):
            first.get(timeout=10)
    finally:
        worker.stop()
        app.close()


@pytest.mark.parametrize("pool", ["prefork", "gevent"])
def test_a_hard_time_limit_fails_the_thread_and_its_first_task_once(
    pool: str,
    redis_server: RedisServer,
    redis_broker: str,
    result_backend: str,
    ledger: redis.Redis,
    tmp_path: Path,
) -> None:
    prefix = f"tl{uuid.uuid4().hex[:8]}"
    env = {
        "AGENTQ_TEST_BROKER": redis_broker,
        "AGENTQ_TEST_BACKEND": result_backend,
        "AGENTQ_TEST_STORE": redis_server.url,
        "AGENTQ_TEST_LEDGER": redis_server.url,
        "AGENTQ_TEST_PREFIX": prefix,
        "AGENTQ_TEST_QUEUE": f"agentq-test-{prefix}",
    }
    app = time_limit_app.make(
        redis_broker, result_backend, redis_server.url, prefix + ":", env["AGENTQ_TEST_QUEUE"]
    )
    agent, note = app.tasks["tests.slow_once"], app.tasks["tests.note"]
    worker = WorkerProcess(
        app, env, tmp_path, pool=pool, app_module="tests.support.time_limit_app"
    ).start()
    try:
        first = agent.apply_async(
            ("t1",), link=note.si(tag="callback"), link_error=note.si(tag="errback")
        )
        wait_until(
            lambda: agent.thread("t1").status in (Status.FAILED, Status.DONE),
            timeout=60,
            what="the thread to end",
        )
        meta = agent.thread("t1")
        assert meta.status == Status.FAILED, meta.status
        assert meta.error is not None and "hard time limit (3 s)" in meta.error
        assert "step 1" in meta.error
        with pytest.raises(TimeLimitExceeded):
            first.get(timeout=10)
        notes = f"{prefix}:notes"
        wait_until(lambda: ledger.llen(notes) > 0, timeout=20, what="the errback")
        assert "callback" not in ledger.lrange(notes, 0, -1)
        assert ledger.get(f"{prefix}:slow:t1") == "1"  # not run again as a lost worker's
    finally:
        worker.stop()
        app.close()
