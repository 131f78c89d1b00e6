"""The sweeper in a process that does not import the agent (``agentq sweep`` beside the
workers): it sends due threads by task name, routed as they were first sent."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

import agentq
from agentq.celery.recovery import Sweeper
from agentq.store.contract import Store
from agentq.store.redis.store import RedisStore
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


def test_a_broker_outage_is_logged_a_line_a_sweep_without_a_traceback(
    redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker restart fails every send of a due thread until it is back: like a store
    outage, a warning line a sweep, not a traceback logged as an error each interval."""
    caplog.set_level(logging.WARNING, logger="agentq.celery.recovery")
    with running_redis(tmp_path / "broker") as broker:
        app = Celery("agentq-sweeper-broker-down", broker=broker.url, set_as_current=False)
        with contextlib.closing(app):
            agentq.init_app(
                app,
                store=redis_server.url,
                prefix=f"sb{uuid.uuid4().hex[:8]}:",
                sweep_interval=0.1,
                start_grace=0.1,
            )
            store: Store = app._agentq_runtime.store
            sweeper = Sweeper(app)
            broker.kill()
            store.open_thread("t1", task="elsewhere.agent", start_grace=0)
            sweeper.start()
            try:
                wait_until(lambda: len(failures(caplog)) >= 2, timeout=20, what="two failed sweeps")
            finally:
                sweeper.stop()
                store.close()
    for record in failures(caplog):
        assert (record.levelno, record.exc_info) == (logging.WARNING, None)
        assert record.getMessage().startswith("sweep failed (OperationalError: ")


def failures(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith("sweep failed")]


def test_a_thread_whose_lease_runs_out_while_finished_threads_are_collected_is_sent_in_time(
    redis_broker: str, redis_server: RedisServer
) -> None:
    """The sweeper also deletes the finished threads past ``finished_ttl``; a backlog of
    them (a batch of runs that finished together a week ago) must not hold up the sweeps
    behind it: a thread whose worker died meanwhile is sent within a sweep or so of its
    lease running out, not once every finished thread is gone."""
    finished = 4000
    app = Celery("agentq-sweeper-gc", broker=redis_broker, set_as_current=False)
    app.conf.task_default_queue = f"agentq-test-sweep-gc-{uuid.uuid4().hex[:8]}"
    prefix = f"sg{uuid.uuid4().hex[:8]}:"
    agentq.init_app(
        app, store=redis_server.url, prefix=prefix, sweep_interval=0.05, finished_ttl=0.0
    )
    store = app._agentq_runtime.store
    with contextlib.closing(app), contextlib.closing(redis_server.client()) as raw:
        for n in range(finished):
            store.open_thread(f"old-{n}", task="elsewhere.agent")
            store.request_cancel(f"old-{n}")
        store.open_thread("dead", task="elsewhere.agent")
        cancelled = f"{prefix}index:{{index}}:status:cancelled"
        due = f"{prefix}index:{{index}}:due"
        sweeper = Sweeper(app)
        sweeper.start()
        try:
            wait_until(lambda: raw.zcard(cancelled) < finished, timeout=20, what="gc started")
            store.acquire("dead", "lost-worker", 0.2)  # its worker dies at once

            def sent() -> tuple[str, int] | None:
                # Held off a start grace once sent; how much of the backlog is left then.
                if (raw.zscore(due, "dead") or 0) > time.time() + 5:
                    return ("sent", raw.zcard(cancelled))
                return None

            _, left = wait_until(sent, timeout=30, what="the dead worker's thread sent")
        finally:
            sweeper.stop()
            store.gc(0.0)  # what the sweeper left of the backlog
            store.close()
    # Not after every finished thread was deleted, as when one call collected them all.
    assert left > 0, "the thread was sent only once the whole backlog was deleted"


def test_one_sweep_sends_every_due_thread_however_many(app: Celery) -> None:
    """A worker running a thousand threads (a threads or gevent pool) dies: every one of
    them is due at once, and every one must be sent by the next sweep, not 500 a sweep."""
    store: Store = app._agentq_runtime.store
    due = 1100
    for n in range(due):
        store.open_thread(f"t{n}", task="elsewhere.agent", start_grace=0)
    try:
        assert len(Sweeper(app).sweep_once()) == due
        assert store.due() == []
    finally:
        with contextlib.closing(redis.Redis.from_url(app.conf.broker_url)) as broker:
            broker.delete(app.conf.task_default_queue)


def test_a_concurrency_key_that_cannot_be_read_does_not_stop_recovery(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    """Waking concurrency keys comes first in a sweep; a key it cannot read (here one of
    another type where the active keys are kept) is logged, and due threads still go."""
    store = app._agentq_runtime.store
    assert isinstance(store, RedisStore)
    store.client.set(store.keys.thread_keys_active(), "not a set")
    store.open_thread("t1", task="elsewhere.agent", start_grace=0)
    try:
        assert Sweeper(app).sweep_once() == ["t1"]
    finally:
        with contextlib.closing(redis.Redis.from_url(app.conf.broker_url)) as broker:
            broker.delete(app.conf.task_default_queue)
    [logged] = [r for r in caplog.records if r.getMessage().startswith("waking concurrency")]
    assert logged.levelno == logging.ERROR and logged.exc_info is not None
    assert "WRONGTYPE" in str(logged.exc_info[1])


def test_a_sweep_sends_each_due_thread_once_when_sending_outlasts_the_start_grace(
    redis_broker: str, redis_server: RedisServer
) -> None:
    """Each claim holds its threads off a start grace; when sending a batch takes longer
    than that (a slow broker, a short grace), the first batch is due again before the last
    one is claimed. The sweep must still end, having sent each thread once, rather than
    claim and send the same threads again for as long as every batch comes back full."""
    app = Celery("agentq-sweeper-slow-send", broker=redis_broker, set_as_current=False)
    app.conf.task_default_queue = f"agentq-test-sweep-slow-{uuid.uuid4().hex[:8]}"
    agentq.init_app(
        app, store=redis_server.url, prefix=f"ss{uuid.uuid4().hex[:8]}:", start_grace=0.01
    )
    store: Store = app._agentq_runtime.store
    due = 1100
    for n in range(due):
        store.open_thread(f"t{n}", task="elsewhere.agent", start_grace=0)
    sweeper = Sweeper(app)
    sent: list[str] = []
    sweeping = threading.Thread(target=lambda: sent.extend(sweeper.sweep_once()), daemon=True)
    try:
        sweeping.start()
        sweeping.join(timeout=20)
        ended = not sweeping.is_alive()
        sweeper._stop.set()  # breaks off a sweep that would not end by itself
        sweeping.join(timeout=20)
        assert ended, "the sweep kept sending the threads it had sent already"
        assert sorted(sent) == sorted(f"t{n}" for n in range(due))
    finally:
        store.close()
        with contextlib.closing(redis.Redis.from_url(redis_broker)) as broker:
            broker.delete(app.conf.task_default_queue)
        app.close()


def test_a_thread_whose_messages_wait_in_a_backlog_is_sent_ever_less_often(
    redis_broker: str, redis_server: RedisServer
) -> None:
    """No worker takes the thread (its messages wait behind a backlog): every send would
    add one more message to that backlog. Sent again after as long as it has waited, its
    sends come twice as far apart each time, not once a start grace."""
    grace = 0.2
    app = Celery("agentq-sweeper-backlog", broker=redis_broker, set_as_current=False)
    app.conf.task_default_queue = f"agentq-test-sweep-backlog-{uuid.uuid4().hex[:8]}"
    agentq.init_app(
        app, store=redis_server.url, prefix=f"sb{uuid.uuid4().hex[:8]}:", start_grace=grace
    )
    store: Store = app._agentq_runtime.store
    sweeper = Sweeper(app)
    try:
        store.open_thread("t1", task="elsewhere.agent", start_grace=0)
        opened = time.monotonic()
        sends = 0
        while (waited := time.monotonic() - opened) < 20 * grace:
            sends += len(sweeper.sweep_once())
            time.sleep(grace / 20)  # the sweep interval
        # Sent at once, then after waiting 1, 2, 4, 8, 16 graces (a grace each: 20 sends).
        assert 3 <= sends <= 3 + math.log2(waited / grace), sends
        with contextlib.closing(redis.Redis.from_url(redis_broker)) as broker:
            assert broker.llen(app.conf.task_default_queue) == sends
    finally:
        store.close()
        with contextlib.closing(redis.Redis.from_url(redis_broker)) as broker:
            broker.delete(app.conf.task_default_queue)
        app.close()


def test_a_due_entry_of_a_thread_that_does_not_run_by_itself_is_put_right_not_reported_sent(
    app: Celery, redis_server: RedisServer
) -> None:
    """On Redis Cluster a thread's index call can be lost, leaving a due entry for a thread
    that has ended: the sweep sends nothing for it, so it is not among the threads it
    reports sent (``agentq sweep --once`` prints them as re-sent)."""
    store: Store = app._agentq_runtime.store
    store.open_thread("ended", task="elsewhere.agent")
    store.request_cancel("ended")
    store.open_thread("lost", task="elsewhere.agent", start_grace=0)
    due = f"{app._agentq_runtime.settings.prefix}index:{{index}}:due"
    with contextlib.closing(redis_server.client()) as raw:
        raw.zadd(due, {"ended": 0})  # what the lost second call left behind
        try:
            assert Sweeper(app).sweep_once() == ["lost"]
        finally:
            with contextlib.closing(redis.Redis.from_url(app.conf.broker_url)) as broker:
                broker.delete(app.conf.task_default_queue)
