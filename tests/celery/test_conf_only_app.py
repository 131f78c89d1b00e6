"""An app configured by ``app.conf.agentq_*`` alone, without ``init_app``: its workers
still run recovery, since nothing else would ever send a thread whose message is gone."""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

import agentq
from agentq import AgentTask, Done, Run, Status
from tests.support.redis_server import RedisServer, wait_until


class _ConfOnlyAgent(AgentTask):
    name = "tests.conf_only_agent"

    def start(self, run: Run) -> Any:
        return Done("ran")


def test_a_worker_of_an_app_configured_by_its_conf_alone_sweeps_due_threads(
    redis_broker: str, redis_server: RedisServer
) -> None:
    prefix = f"co{uuid.uuid4().hex[:8]}:"
    app = Celery("agentq-conf-only", broker=redis_broker, set_as_current=False)
    app.conf.task_default_queue = f"agentq-test-{prefix}"
    app.conf.agentq_store = redis_server.url
    app.conf.agentq_prefix = prefix
    app.conf.agentq_sweep_interval = 0.1
    app.register_task(_ConfOnlyAgent())
    with contextlib.closing(agentq.open_store(redis_server.url, prefix=prefix)) as store:
        # Queued in the store with no message, as after a send lost with its broker:
        # only a sweeper sends it.
        store.open_thread("t1", task=_ConfOnlyAgent.name, start_grace=0)
        with start_worker(app, pool="solo", perform_ping_check=False):
            meta = wait_until(
                lambda: (m := store.meta("t1")) is not None and m.status is Status.DONE and m,
                timeout=20,
                what="the swept thread done",
            )
    assert meta.result == "ran"
    app._agentq_runtime.store.close()
    app.close()


def test_a_configuration_loaded_after_init_app_names_the_store(
    redis_broker: str, redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # where the default SQLite store would be made
    prefix = f"co{uuid.uuid4().hex[:8]}:"
    app = Celery("agentq-config-after-init", set_as_current=False)
    agentq.init_app(app)
    # The usual Celery module: its config_from_object below the wiring, as with Django's.
    app.config_from_object(
        {
            "broker_url": redis_broker,
            "task_default_queue": f"agentq-test-{prefix}",
            "agentq_store": redis_server.url,
            "agentq_prefix": prefix,
        }
    )
    agent = app.register_task(_ConfOnlyAgent())
    agent.delay("t1")
    with contextlib.closing(agentq.open_store(redis_server.url, prefix=prefix)) as store:
        meta = store.meta("t1")
    assert meta is not None and meta.status is Status.QUEUED
    assert not list(tmp_path.iterdir())
    app._agentq_runtime.store.close()
    app.close()


def test_a_setting_made_after_init_app_names_the_store(
    redis_broker: str, redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # where the default SQLite store would be made
    prefix = f"co{uuid.uuid4().hex[:8]}:"
    app = Celery("agentq-setting-after-init", broker=redis_broker, set_as_current=False)
    app.conf.task_default_queue = f"agentq-test-{prefix}"
    agentq.init_app(app)
    # As the README's first agent offers it: the store as a setting instead of an argument.
    app.conf.agentq_store = redis_server.url
    app.conf.agentq_prefix = prefix
    agent = app.register_task(_ConfOnlyAgent())
    agent.delay("t1")
    with contextlib.closing(agentq.open_store(redis_server.url, prefix=prefix)) as store:
        meta = store.meta("t1")
    assert meta is not None and meta.status is Status.QUEUED
    assert not list(tmp_path.iterdir())
    app._agentq_runtime.store.close()
    app.close()


def test_threads_first_using_an_app_configured_by_its_conf_alone_share_one_runtime(
    tmp_path: Path,
) -> None:
    """A web server's threads sending the first threads of an app that never called
    init_app: they must share one runtime, and so one store and one connection pool."""
    import threading

    from agentq.celery.runtime import runtime_of

    app = Celery("conf-only-race", set_as_current=False)
    app.conf.agentq_store = f"sqlite:///{tmp_path / 'agentq.db'}"
    barrier = threading.Barrier(32)
    seen: list[object] = []

    def first_use() -> None:
        barrier.wait()
        seen.append(runtime_of(app))

    threads = [threading.Thread(target=first_use) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(runtime) for runtime in seen}) == 1
