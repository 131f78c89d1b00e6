"""A node's own error of a class the store also raises (a ``redis.ConnectionError`` from
the node's own Redis, a locked SQLite file of its own) is the node's failure: it counts
an attempt and is retried with backoff or fails the thread. Only agentq's own store
calls, out for longer than they could wait, give the thread back."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from celery import Celery

import agentq
from agentq import AgentTask, Done, Run, Status
from agentq.store.redis.store import RedisStore
from tests.support.redis_server import RedisServer, free_port


class OwnRedis(AgentTask):
    """Reads its own cache, a Redis that is down."""

    name = "tests.node_store_errors.own_redis"

    def start(self, run: Run) -> Any:
        cache = redis.Redis(port=free_port(), socket_connect_timeout=1, retry=None)
        return Done(cache.get("answer"))


class RetriedOwnRedis(OwnRedis):
    name = "tests.node_store_errors.retried_own_redis"
    retry_on = (redis.ConnectionError,)


@dataclass
class Declined(Exception):
    """An error compared by value, so unhashable, as a ``@dataclass`` makes it."""

    reason: str


class Declining(AgentTask):
    name = "tests.node_store_errors.declining"
    retry_on = (Declined, TimeoutError)

    def start(self, run: Run, error: str) -> Any:
        raise Declined("card") if error == "declined" else TimeoutError("model call")


@pytest.fixture
def app(redis_server: RedisServer, request: pytest.FixtureRequest) -> Iterator[Celery]:
    store = RedisStore(redis.Redis(port=redis_server.port), prefix=f"{request.node.name}:")
    app = Celery("node-store-errors", broker="memory://", set_as_current=False)
    agentq.init_app(app, store=store, lease_ttl=5)
    yield app
    store.close()
    app.close()


def _run(app: Celery, agent: type[AgentTask], **input: Any) -> Any:
    task = app.register_task(agent())
    task.agentq.store.open_thread("t1", task=task.name, input=input)
    with contextlib.suppress(Exception):  # Celery's Retry, or the node's error
        task.run("t1")
    meta = task.agentq.store.meta("t1")
    assert meta is not None
    return meta


def test_a_nodes_own_connection_error_is_retried_with_an_attempt_counted(app: Celery) -> None:
    meta = _run(app, RetriedOwnRedis)
    assert (meta.status, meta.attempts, meta.crashes) == (Status.RETRYING, 1, 0), meta.error
    assert "ConnectionError" in meta.error


def test_a_nodes_own_connection_error_fails_a_thread_that_does_not_retry_it(
    app: Celery,
) -> None:
    meta = _run(app, OwnRedis)
    assert (meta.status, meta.attempts) == (Status.FAILED, 1), meta.error
    assert "ConnectionError" in meta.error


@pytest.mark.parametrize("error", ["declined", "timeout"])
def test_any_error_a_node_raises_is_retried_as_it_declares(app: Celery, error: str) -> None:
    """Unhashable errors and built-in ones (which take no weak reference) alike."""
    meta = _run(app, Declining, error=error)
    assert (meta.status, meta.attempts) == (Status.RETRYING, 1), meta.error
