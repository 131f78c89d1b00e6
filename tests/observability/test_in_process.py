"""Metrics of an in-process ``-P threads`` worker that serves its own process's counters
(no ``PROMETHEUS_MULTIPROC_DIR``), as a threads or gevent worker usually runs."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest

from agentq.engine import metrics
from agentq.errors import ConfigError
from agentq.store.redis import RedisStore
from tests.support.redis_server import RedisServer, running_redis
from tests.support.threads_worker import threads_worker

pytestmark = pytest.mark.timeout(120)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def exposition(port: int) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return [line for line in reply.read().decode().splitlines() if line.startswith("agentq_")]


def test_a_worker_started_again_in_its_process_serves_its_metrics_once(
    redis_broker: str, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    port = free_port()
    for done in (1, 2):
        worker = threads_worker(redis_broker, redis_server.url, concurrency=4, metrics_port=port)
        with worker as (app, _):
            agent = app.tasks["tests.counting_agent"]
            agent.delay(f"t{done}", n=2)
            assert agent.wait(f"t{done}", timeout=30) == 2
            lines = exposition(port)
            # Each worker has a prefix of its own: the store's gauges count its thread.
            assert [line for line in lines if line.startswith("agentq_threads{")] == [
                f'agentq_threads{{status="{status}"}} {1.0 if status == "done" else 0.0}'
                for status in (
                    "queued",
                    "running",
                    "waiting",
                    "retrying",
                    "done",
                    "failed",
                    "needs_attention",
                    "cancelled",
                )
            ]
            assert sum(line.startswith("agentq_needs_attention ") for line in lines) == 1
            assert any(line.startswith("agentq_steps_committed_total ") for line in lines)
            # A healthy store commits in well under a millisecond: buckets that start
            # at 5 ms would put every commit in the first and hide a slowdown.
            bounds = [
                float(line.split('le="')[1].split('"')[0])
                for line in lines
                if line.startswith("agentq_commit_seconds_bucket")
            ]
            assert min(bounds) <= 0.0005, bounds
        # A stopped worker frees its port.
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=5):
            pass


def test_a_metrics_port_in_use_is_refused_naming_the_setting(redis_server: RedisServer) -> None:
    store = RedisStore.from_url(redis_server.url, prefix="mp-in-use:")
    try:
        with socket.socket() as taken:
            taken.bind(("0.0.0.0", 0))
            taken.listen()
            with pytest.raises(ConfigError, match="metrics_port"):
                metrics.serve(store, taken.getsockname()[1])
    finally:
        store.close()


def test_a_store_outage_leaves_the_workers_counters_readable(
    redis_broker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    port = free_port()
    with running_redis(tmp_path / "store") as server:
        worker = threads_worker(redis_broker, server.url, concurrency=2, metrics_port=port)
        with worker as (app, _):
            agent = app.tasks["tests.counting_agent"]
            agent.delay("t1", n=1)
            assert agent.wait("t1", timeout=30) == 1
            assert 'agentq_threads{status="done"} 1.0' in exposition(port)
            server.kill()
            # What the worker did, when the store cannot say what it holds.
            lines = exposition(port)
            assert any(line.startswith("agentq_steps_committed_total ") for line in lines)
            assert any(line.startswith("agentq_leases_lost_total ") for line in lines)
            assert not any(line.startswith("agentq_threads") for line in lines)
            server.start()
            assert 'agentq_threads{status="done"} 1.0' in exposition(port)
