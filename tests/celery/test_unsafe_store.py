"""A store that would lose checkpoints is refused by workers, noticed when it changes under
them, and a checkpoint it lost is reported as data loss, never taken for a new thread."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from agentq import Status
from agentq.celery import recovery
from agentq.errors import ThreadStopped
from agentq.store.redis.findings import redis_findings
from tests.support.agents import make_app
from tests.support.redis_server import RedisServer, running_redis, wait_until
from tests.support.threads_worker import threads_worker
from tests.support.workers import WorkerProcess

EVICTING = ("--maxmemory-policy", "allkeys-lru")


def test_eviction_and_no_persistence_are_fatal_an_unsynced_aof_only_warns() -> None:
    def fatal(config: dict[str, str]) -> dict[str, bool]:
        return {f.setting: f.fatal for f in redis_findings(config)}

    assert fatal({"appendonly": "no", "save": ""}) == {"appendonly": True}
    assert fatal(
        {"appendonly": "yes", "appendfsync": "always", "maxmemory-policy": "allkeys-lru"}
    ) == {"maxmemory-policy": True}
    assert fatal({"appendonly": "no", "save": "3600 1"}) == {"appendonly": False}
    assert fatal({"appendonly": "yes", "appendfsync": "no"}) == {"appendfsync": False}


def test_a_worker_refuses_an_evicting_store(redis_broker: str, tmp_path: Path) -> None:
    prefix = f"us{uuid.uuid4().hex[:8]}:"
    with running_redis(tmp_path / "store", *EVICTING) as server:
        env = {
            "AGENTQ_TEST_BROKER": redis_broker,
            "AGENTQ_TEST_STORE": server.url,
            "AGENTQ_TEST_PREFIX": prefix,
            "AGENTQ_TEST_QUEUE": f"agentq-unsafe-{prefix}",
            "AGENTQ_TEST_LEDGER": server.url,
        }
        app = make_app(
            broker=redis_broker,
            store=server.url,
            prefix=prefix,
            queue=env["AGENTQ_TEST_QUEUE"],
            ledger_url=server.url,
        )
        worker = WorkerProcess(app, env, tmp_path)
        try:
            with pytest.raises(RuntimeError, match="worker exited with 1"):
                worker.start()
        finally:
            worker.stop()
            app._agentq_runtime.store.close()
            app.close()
    log = worker.log.read_text()
    assert "UnsafeStore" in log
    assert "maxmemory-policy=allkeys-lru" in log
    assert "set maxmemory-policy noeviction" in log


def test_allow_unsafe_store_starts_the_worker_with_a_warning(
    redis_broker: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.WARNING, logger="agentq.store"),
        running_redis(tmp_path / "store", *EVICTING) as server,
        threads_worker(redis_broker, server.url, concurrency=2, allow_unsafe_store=True) as (
            app,
            _,
        ),
    ):
        app.tasks["tests.counting_agent"].delay("t1", n=2)
        app.tasks["tests.counting_agent"].wait("t1", timeout=30)
    warned = [r.getMessage() for r in caplog.records if r.name == "agentq.store"]
    assert any("maxmemory-policy=allkeys-lru" in m and "allowed" in m for m in warned), warned


def test_eviction_turned_on_at_runtime_is_logged_by_the_sweeper(
    redis_broker: str,
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(recovery, "STORE_CHECK_INTERVAL", 0.2)
    client = redis_server.client()
    try:
        with (
            caplog.at_level(logging.ERROR, logger="agentq.store"),
            threads_worker(redis_broker, redis_server.url, concurrency=1, sweep_interval=0.1),
        ):
            client.config_set("maxmemory-policy", "allkeys-lru")

            def errors() -> list[str]:
                return [
                    r.getMessage()
                    for r in caplog.records
                    if r.name == "agentq.store" and r.levelno == logging.ERROR
                ]

            wait_until(lambda: len(errors()) >= 2, timeout=20, what="the change logged twice")
    finally:
        client.config_set("maxmemory-policy", "noeviction")
        client.close()
    assert "maxmemory-policy=allkeys-lru" in errors()[0]
    assert "noeviction" in errors()[0]


@pytest.mark.parametrize("lost", ["latest", "checkpoints"])
def test_a_thread_whose_checkpoint_is_gone_is_reported_as_data_loss(
    redis_broker: str, redis_server: RedisServer, lost: str
) -> None:
    with threads_worker(redis_broker, redis_server.url, concurrency=1) as (app, _):
        agent = app.tasks["tests.approval_agent"]
        agent.delay("t1", amount=5)
        wait_until(lambda: agent.thread("t1").status == Status.WAITING, timeout=30, what="waiting")
        step = agent.thread("t1").step
        assert step >= 0
        prefix = app._agentq_runtime.settings.prefix
        client = redis_server.client()
        try:
            # What an evicting server drops under memory pressure, deleted by hand here.
            pattern = "latest" if lost == "latest" else "checkpoint:*"
            keys = client.keys(f"{prefix}thread:{{t1}}:{pattern}")
            assert keys
            client.delete(*keys)
        finally:
            client.close()
        agent.resume("t1", {"approved": True})
        with pytest.raises(ThreadStopped) as stopped:
            agent.wait("t1", timeout=30)
        meta = agent.thread("t1")
    assert stopped.value.status == Status.NEEDS_ATTENTION.value
    assert meta.error is not None and "data loss" in meta.error
    assert meta.step == step  # not started again from step 0
