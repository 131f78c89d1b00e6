"""What an operator's commands on the Redis store do to threads in flight on a worker:
scripts flushed and connections killed are waited out, the data flushed is reported."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from agentq import Status
from agentq.store.contract import Store
from tests.support.redis_server import running_redis, wait_until
from tests.support.threads_worker import statuses, threads_worker

THREADS = [f"t{n}" for n in range(8)]


@contextlib.contextmanager
def in_flight(redis_broker: str, tmp_path: Path) -> Iterator[tuple[Store, redis.Redis]]:
    """Every thread of :data:`THREADS` past its first step and running on one worker,
    and an admin connection to its store."""
    with (
        running_redis(tmp_path / "store") as server,
        threads_worker(redis_broker, server.url, concurrency=len(THREADS)) as (app, store),
        contextlib.closing(redis.Redis(port=server.port)) as admin,
    ):
        agent = app.tasks["tests.waiting_agent"]
        for thread_id in THREADS:
            agent.delay(thread_id, steps=8, wait=0.2)

        def all_running() -> bool:
            metas = [store.meta(t) for t in THREADS]
            return all(m is not None and m.status is Status.RUNNING and m.step >= 1 for m in metas)

        wait_until(all_running, timeout=30, what="every thread running past its first step")
        yield store, admin


def _kill_store_clients(admin: redis.Redis) -> None:
    admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")


@pytest.mark.parametrize(
    "disturb",
    [lambda admin: admin.script_flush(), _kill_store_clients],
    ids=["script-flush", "client-kill"],
)
def test_flushed_scripts_and_killed_connections_are_waited_out(
    redis_broker: str, tmp_path: Path, disturb: Callable[[redis.Redis], object]
) -> None:
    with in_flight(redis_broker, tmp_path) as (store, admin):
        disturb(admin)
        wait_until(
            lambda: set(statuses(store, THREADS).values()) == {Status.DONE},
            timeout=60,
            what="every thread done",
        )
        for thread_id in THREADS:
            meta = store.meta(thread_id)
            assert meta is not None and (meta.result, meta.crashes) == (8, 0)


def test_a_flushed_store_stops_its_threads_saying_so_and_writes_nothing_back(
    redis_broker: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with in_flight(redis_broker, tmp_path) as (store, admin):
        admin.flushdb()

        def told() -> set[str]:
            return {
                thread_id
                for thread_id in THREADS
                for record in caplog.records
                if f"thread '{thread_id}', step" in (message := record.getMessage())
                and "deleted from the store while a worker drove it" in message
            }

        # In the error its task raised, which Celery logs.
        wait_until(lambda: told() == set(THREADS), timeout=30, what="every thread reported")
        assert [store.meta(t) for t in THREADS] == [None] * len(THREADS)
        assert admin.keys("*thread:*") == []  # not a step, a lease or a status written back
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [m for m in messages if "recovery resumes" in m or "another worker" in m]
