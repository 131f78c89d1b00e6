"""What the ``store`` setting takes besides a URL: a redis-py client the user configured
(its pool, timeouts and retries kept), and a clear refusal of anything else."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker

import agentq
from agentq import AgentTask, Done, Run, Status
from agentq.errors import SettingsError
from agentq.store.redis.store import RedisStore
from tests.support.redis_server import RedisServer, wait_until


class _ClientAgent(AgentTask):
    name = "tests.client_store_agent"

    def start(self, run: Run, word: str) -> Any:
        run.state["word"] = word
        return "shout"

    def shout(self, run: Run) -> Any:
        return Done(run.state["word"].upper())


def _app(broker: str, prefix: str) -> Celery:
    app = Celery("agentq-client-store", broker=broker, set_as_current=False)
    app.conf.task_default_queue = f"agentq-test-{prefix}"
    app.register_task(_ClientAgent())
    return app


def test_a_redis_py_client_given_as_the_store_runs_threads_on_its_pool(
    redis_broker: str, redis_server: RedisServer
) -> None:
    prefix = f"cl{uuid.uuid4().hex[:8]}:"
    pool = redis.BlockingConnectionPool(port=redis_server.port, db=4, max_connections=3)
    client = redis.Redis(connection_pool=pool)
    app = _app(redis_broker, prefix)
    runtime = agentq.init_app(app, store=client, prefix=prefix, keep_last=1)
    store = runtime.store
    assert isinstance(store, RedisStore) and store.client is client
    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False):
        app.tasks[_ClientAgent.name].delay("t1", word="durable")
        meta = wait_until(
            lambda: (m := store.meta("t1")) is not None and m.status is Status.DONE and m,
            timeout=30,
            what="the thread done",
        )
    assert meta.result == "DURABLE"
    assert [c.step for c in store.history("t1")] == [1]  # keep_last reached the store
    with contextlib.closing(redis.Redis(port=redis_server.port, db=4)) as admin:
        assert admin.exists(f"{prefix}thread:{{t1}}:meta")  # the client's database
    store.close()
    app.close()


def test_a_store_setting_of_another_kind_is_refused_naming_what_to_give(
    redis_broker: str, redis_server: RedisServer
) -> None:
    pool = redis.ConnectionPool(port=redis_server.port)
    app = _app(redis_broker, "refused:")
    with pytest.raises(SettingsError, match=r"ConnectionPool.*redis.Redis\(connection_pool=pool\)"):
        agentq.init_app(app, store=pool)
    pool.disconnect()
    app.close()


def test_a_configuration_loaded_after_init_app_with_a_client_counts(
    redis_broker: str, redis_server: RedisServer
) -> None:
    prefix = f"cl{uuid.uuid4().hex[:8]}:"
    client = redis.Redis(port=redis_server.port, db=5)
    app = Celery("agentq-client-config-after", set_as_current=False)
    agentq.init_app(app, store=client)
    # The usual Celery module: its config_from_object below the wiring, as with Django's.
    app.config_from_object(
        {
            "broker_url": redis_broker,
            "task_default_queue": f"agentq-test-{prefix}",
            "agentq_prefix": prefix,
            "agentq_keep_last": 1,
        }
    )
    agent = app.register_task(_ClientAgent())
    agent.delay("t1", word="durable")
    store = app._agentq_runtime.store
    assert isinstance(store, RedisStore) and store.client is client
    assert client.exists(f"{prefix}thread:{{t1}}:meta")
    assert app._agentq_runtime.settings.keep_last == 1
    client.close()
    app.close()
