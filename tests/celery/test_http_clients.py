"""Agents calling a model API over HTTP with httpx, the client the openai and anthropic SDKs
wrap, on a ``celery worker`` subprocess of each pool that holds many threads at once: one
``httpx.Client`` made at import and shared by every node, or one ``httpx.AsyncClient``
made at import and awaited in ``async def`` nodes on agentq's loop. Every thread ends done,
the server saw each call exactly once (none repeated, none lost), and the worker logs no
failed task, no traceback and none of the errors a client used across loops, threads or
greenlets raises.

CI size: 100 threads of 3 calls on ``-c 100``. Run by hand at 500 threads of 4 calls on
``-P threads -c 500`` and ``-P gevent -c 500`` (see the README's "Many agents per worker").
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from celery import Celery

from agentq import Status
from agentq.store.contract import Store
from tests.support.agents import make_app
from tests.support.http_agents import HttpAsyncAgent, HttpSyncAgent
from tests.support.redis_server import RedisServer, free_port, wait_until
from tests.support.workers import ROOT, WorkerProcess

# A worker's start and 100 threads of 3 calls of 0.2 s take a few seconds; a loaded 2-core
# machine may need ten times that.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

WORKER_APP = "tests.support.http_worker_app"
THREADS = 100
CALLS = 3
LATENCY = 0.2
CLIENT_ERRORS = (
    "attached to a different loop",
    "Event loop is closed",
    "PoolTimeout",
    "ConcurrentObjectUseError",
    "Cannot switch to a different thread",
    "Traceback",
    "ERROR/",
)


@pytest.fixture
def model_url() -> Iterator[str]:
    """A :mod:`tests.support.model_server` answering after ``LATENCY``."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.support.model_server", str(port), str(LATENCY)], cwd=ROOT
    )
    # "localhost", as an API's host name: the async client resolves it on the loop.
    url = f"http://localhost:{port}"
    try:
        wait_until(lambda: _answers(url), timeout=30, interval=0.05, what="the model server")
        yield url
    finally:
        server.kill()
        server.wait()


def _answers(url: str) -> bool:
    try:
        calls(url)
    except OSError:
        return False
    return True


def calls(url: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{url}/calls", timeout=10) as reply:
        counted: dict[str, int] = json.load(reply)
    return counted


@pytest.mark.parametrize("client", ["sync", "async"])
@pytest.mark.parametrize("pool", ["threads", "gevent"])
def test_every_thread_makes_each_model_call_once(
    pool: str,
    client: str,
    model_url: str,
    redis_broker: str,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    if pool == "gevent":
        pytest.importorskip("gevent")
    prefix = f"hc{uuid.uuid4().hex[:8]}:"
    env = {
        "AGENTQ_TEST_BROKER": redis_broker,
        "AGENTQ_TEST_STORE": redis_server.url,
        "AGENTQ_TEST_PREFIX": prefix,
        "AGENTQ_TEST_QUEUE": f"agentq-http-{prefix}",
        "AGENTQ_TEST_MODEL_URL": model_url,
        "AGENTQ_TEST_CONCURRENCY": str(THREADS),
    }
    app: Celery = make_app(
        broker=redis_broker,
        store=redis_server.url,
        prefix=prefix,
        queue=env["AGENTQ_TEST_QUEUE"],
        ledger_url=redis_server.url,
    )
    store: Store = app._agentq_runtime.store
    agent = app.register_task({"sync": HttpSyncAgent, "async": HttpAsyncAgent}[client]())
    worker = WorkerProcess(
        app, env, tmp_path, concurrency=THREADS, pool=pool, app_module=WORKER_APP
    )
    thread_ids = [f"{client}-{n}" for n in range(THREADS)]
    try:
        worker.start()
        with ThreadPoolExecutor(8) as senders:
            list(senders.map(lambda t: agent.delay(t, calls=CALLS), thread_ids))
        wait_until(
            lambda: store.status_counts()[Status.DONE] == THREADS,
            timeout=180,
            interval=0.2,
            what=f"{THREADS} threads done",
        )
    finally:
        worker.stop()
        store.close()
        app.close()
    expected = {f"{t}/{call}": 1 for t in thread_ids for call in range(CALLS)}
    assert calls(model_url) == expected
    log = worker.log.read_text(errors="replace")
    assert [e for e in CLIENT_ERRORS if e in log] == []
