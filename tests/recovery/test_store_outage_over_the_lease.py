"""A store down for longer than the lease, while a node runs, is an outage and not a lost
worker: once it answers again, the driver gives the thread back (queued, no crash
counted) unless another worker took it over meanwhile. A store still down when the driver
stops waiting leaves the thread to recovery, and the task ends handed over, not failed.

The store is a private ``redis-server`` (AOF always) SIGKILLed from inside the node and
started again on the same data; the driver runs in this process (``task.run``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Ignore

import agentq
from agentq import AgentTask, Done, Run, Status
from agentq.records import ThreadMeta
from agentq.store.redis.store import RedisStore
from tests.support.redis_server import RedisServer

TTL = 1.0


class LeaseLostLog(logging.Handler):
    """Sets ``lost`` when the lease keeper reports a lease lost: run out while the store
    was down, or refused by the store back up after it expired."""

    def __init__(self) -> None:
        super().__init__()
        self.lost = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "ran out unrenewed" in message or "lease lost" in message:
            self.lost.set()


class Env:
    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.store = RedisStore.from_url(server.url, prefix="outage:")
        self.app = Celery("outage", broker="memory://", set_as_current=False)
        agentq.init_app(self.app, store=self.store, lease_ttl=TTL)
        self.log = LeaseLostLog()

    def outage(self) -> None:
        """The store down for twice the lease, then back on the same data."""
        self.server.restart(down=2 * TTL)

    def run(self, agent: type[AgentTask]) -> ThreadMeta:
        task = self.app.register_task(agent())
        task.env = self  # type: ignore[attr-defined]
        self.store.open_thread("t1", task=task.name)
        with contextlib.suppress(Exception):  # the HANDED_OVER state, raised as Ignore
            task.run("t1")
        meta = self.store.meta("t1")
        assert meta is not None
        return meta


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    server = RedisServer(tmp_path / "store").start()
    environment = Env(server)
    keeper_log = logging.getLogger("agentq.engine.lease")
    # An in-process worker earlier in the session may have set the root logger to ERROR.
    level = keeper_log.level
    keeper_log.setLevel(logging.WARNING)
    keeper_log.addHandler(environment.log)
    try:
        yield environment
    finally:
        keeper_log.removeHandler(environment.log)
        keeper_log.setLevel(level)
        environment.store.close()
        environment.app.close()
        server.stop()


class ToolAfterOutage(AgentTask):
    """Its tool call, made after the outage, finds the lease gone."""

    name = "tests.outage.tool_after"

    def start(self, run: Run) -> Any:
        self.env.outage()  # type: ignore[attr-defined]
        return Done(run.tool(self.send, key="send-1"))

    def send(self) -> str:
        raise AssertionError("the call ran without a lease")


class StepAcrossOutage(AgentTask):
    """Its first step ends after the outage, its lease lost meanwhile."""

    name = "tests.outage.step_across"

    def start(self, run: Run) -> Any:
        self.env.outage()  # type: ignore[attr-defined]
        assert self.env.log.lost.wait(10 * TTL)  # type: ignore[attr-defined]
        return "finish"

    def finish(self, run: Run) -> Any:
        raise AssertionError("the next step ran without a lease")


@pytest.mark.parametrize("agent", [ToolAfterOutage, StepAcrossOutage])
def test_an_outage_longer_than_the_lease_gives_the_thread_back(
    env: Env, agent: type[AgentTask]
) -> None:
    meta = env.run(agent)
    assert (meta.status, meta.crashes, meta.attempts) == (Status.QUEUED, 0, 0), meta.error


class StoreGoneAfterNode(AgentTask):
    """Its node ends with the store down, and the store stays down."""

    name = "tests.outage.store_gone"

    def start(self, run: Run) -> Any:
        self.env.server.kill()  # type: ignore[attr-defined]
        return "finish"

    def finish(self, run: Run) -> Any:
        raise AssertionError("the next step ran without a store")


def test_a_store_still_down_ends_the_task_handed_over_and_leaves_the_thread_to_recovery(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    task = env.app.register_task(StoreGoneAfterNode())
    task.env = env  # type: ignore[attr-defined]
    env.store.open_thread("t1", task=task.name)
    caplog.set_level(logging.WARNING, logger="agentq")
    with pytest.raises(Ignore):  # HANDED_OVER: not the store's ConnectionError
        task.run("t1")
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    # One line for the task, not one more for the hand-back that found the store down.
    (line,) = [m for m in said if "unreachable" in m]
    assert line.startswith("thread t1: the store stayed unreachable (ConnectionError: "), said
    assert line.endswith("recovery sends the thread again once its lease runs out"), said
    env.server.start()
    meta = env.store.meta("t1")
    assert meta is not None
    # Still running under the lost lease, due at its expiry; no step, crash or attempt.
    assert (meta.status, meta.step, meta.crashes, meta.attempts) == (Status.RUNNING, -1, 0, 0)
