"""The sweeper in a process that does not import the agent (``agentq sweep`` beside the
workers): it sends due threads by task name, routed as they were first sent."""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

import agentq
from agentq.celery.recovery import Sweeper
from agentq.store.contract import Store
from tests.support.redis_server import RedisServer, running_redis, wait_until


@pytest.fixture
def app(redis_broker: str, redis_server: RedisServer) -> Iterator[Celery]:
    app = Celery("agentq-sweeper-tests", broker=redis_broker, set_as_current=False)
    app.conf.task_default_queue = f"agentq-test-sweep-default-{uuid.uuid4().hex[:8]}"
    agentq.init_app(app, store=redis_server.url, prefix=f"sw{uuid.uuid4().hex[:8]}:")
    yield app
    app._agentq_runtime.store.close()
    app.close()


def test_a_due_thread_of_an_unknown_task_is_sent_by_name_to_its_queue(
    app: Celery, redis_broker: str
) -> None:
    store: Store = app._agentq_runtime.store
    queue = f"agentq-test-sweep-{uuid.uuid4().hex[:8]}"
    store.open_thread("t1", task="elsewhere.agent", start_grace=0, options={"queue": queue})
    assert Sweeper(app).sweep_once() == ["t1"]
    with contextlib.closing(redis.Redis.from_url(redis_broker)) as broker:
        messages = broker.lrange(queue, 0, -1)  # kombu's Redis transport: a list per queue
    assert len(messages) == 1
    headers = json.loads(messages[0])["headers"]
    assert (headers["task"], headers["argsrepr"]) == ("elsewhere.agent", "('t1',)")


def test_a_store_outage_is_logged_a_line_a_sweep_without_a_traceback(
    redis_broker: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agentq.celery.recovery")
    app = Celery("agentq-sweeper-outage", broker=redis_broker, set_as_current=False)
    with running_redis(tmp_path / "store") as server, contextlib.closing(app):
        agentq.init_app(app, store=server.url, sweep_interval=0.1)
        sweeper = Sweeper(app)
        server.kill()
        sweeper.start()
        try:
            wait_until(lambda: len(failures(caplog)) >= 2, timeout=10, what="two failed sweeps")
        finally:
            sweeper.stop()
            app._agentq_runtime.store.close()
    for record in failures(caplog):
        assert (record.levelno, record.exc_info) == (logging.WARNING, None)
        assert record.getMessage().startswith("sweep failed (ConnectionError: ")


def failures(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith("sweep failed")]
