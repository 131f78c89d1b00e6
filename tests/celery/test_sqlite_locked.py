"""A SQLite store locked by another process for longer than its busy timeout (a backup, a
long manual transaction) is a store outage, not a lost worker: it must not count toward
``max_crashes``."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
import uuid
from pathlib import Path

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

import agentq
from agentq import Done, Run, Status
from agentq.store.sqlite.connection import BUSY_TIMEOUT


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_database_locked_past_the_busy_timeout_is_not_a_lost_worker(
    redis_broker: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "agentq.db"
    app = Celery("agentq-sqlite-locked", broker=redis_broker, set_as_current=False)
    app.conf.update(
        task_default_queue=f"agentq-test-{uuid.uuid4().hex[:8]}",
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    # One lost worker would fail the thread: an outage counted as one shows at once.
    agentq.init_app(app, store=f"sqlite:///{path}", lease_ttl=5, max_crashes=1, sweep_interval=0.5)
    agent = agentq.agent(app, "tests.sqlite_locked")
    in_node, locked = threading.Event(), threading.Event()

    @agent.node
    def start(run: Run) -> Done:
        if not in_node.is_set():
            in_node.set()
            assert locked.wait(10)
        return Done("ok")

    caplog.set_level(logging.WARNING, logger="agentq")
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        agent.delay("t1")
        assert in_node.wait(20)
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # what a backup or a manual session holds
        locked.set()
        time.sleep(BUSY_TIMEOUT + 2)  # the commit's wait runs out meanwhile
        other.execute("ROLLBACK")
        other.close()
        assert agent.wait("t1", timeout=30) == "ok"
        meta = agent.thread("t1")
        assert meta.status == Status.DONE
    # Queued again as soon as the lock went: not left to the lease's expiry.
    assert (
        "t1: the store stayed unreachable (OperationalError: database is locked); "
        "recovery sends the thread again now" in caplog.text
    )
    app._agentq_runtime.store.close()
    app.close()
