"""The SQLite store under a threads pool of 100: every thread in flight at once, each step a
slow model call and a tool call, and not one ``database is locked`` or refused commit."""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
import uuid
from pathlib import Path

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

import agentq
from agentq import Done, Run, Status
from agentq.celery.runtime import runtime_of

THREADS = 100
STEPS = 3


def test_a_hundred_threads_in_flight_all_finish(
    redis_broker: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = Celery("agentq-sqlite-threads", broker=redis_broker, set_as_current=False)
    app.conf.update(
        task_default_queue=f"agentq-test-{uuid.uuid4().hex[:8]}",
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
    )
    agentq.init_app(app, store=f"sqlite:///{tmp_path / 'agentq.db'}", sweep_interval=0.5)
    agent = agentq.agent(app, "tests.sqlite_threads")
    calls: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    # Every thread waits for the others at its first step, so all are in flight at once.
    everyone = threading.Barrier(THREADS, timeout=60)

    def lookup(thread_id: str, step: int) -> str:
        with lock:
            calls[f"{thread_id}/{step}"] += 1
        return f"fact {step}"

    @agent.node
    def start(run: Run) -> str:
        everyone.wait()
        run.state["facts"] = []
        return "think"

    @agent.node
    def think(run: Run) -> str | Done:
        time.sleep(random.uniform(0.2, 0.5))  # the model answering
        step = len(run.state["facts"])
        fact = run.tool(lookup, run.thread_id, step, key=f"lookup-{step}", idempotent=True)
        run.state["facts"].append(fact)
        return Done(len(run.state["facts"])) if step + 1 == STEPS else "think"

    ids = [f"t{i}" for i in range(THREADS)]
    with (
        caplog.at_level(logging.WARNING),
        start_worker(
            app,
            pool="threads",
            concurrency=THREADS,
            perform_ping_check=False,
            shutdown_timeout=30,
        ),
    ):
        for thread_id in ids:
            agent.delay(thread_id)
        deadline = time.monotonic() + 120
        results = {t: agent.wait(t, timeout=max(0.1, deadline - time.monotonic())) for t in ids}
    store = app._agentq_runtime.store
    try:
        metas = {thread_id: agent.thread(thread_id) for thread_id in ids}
        assert sorted(t for t, m in metas.items() if m.status != Status.DONE) == []
        assert {(m.step, m.attempts, m.crashes) for m in metas.values()} == {(STEPS, 0, 0)}
        # A lost or refused commit re-runs its step, and the tool would be asked twice.
        assert calls == {f"{t}/{s}": 1 for t in ids for s in range(STEPS)}
        assert set(results.values()) == {STEPS}
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    finally:
        store.close()
        app.close()


def test_threads_starting_at_once_share_one_store(tmp_path: Path) -> None:
    app = Celery("agentq-sqlite-first-use", set_as_current=False)
    agentq.init_app(app, store=f"sqlite:///{tmp_path / 'agentq.db'}")
    everyone = threading.Barrier(THREADS, timeout=30)
    stores: list[object] = []

    def first_use() -> None:
        everyone.wait()
        stores.append(runtime_of(app).store)

    threads = [threading.Thread(target=first_use) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert len(stores) == THREADS
        assert len({id(store) for store in stores}) == 1
    finally:
        runtime_of(app).store.close()
        app.close()
