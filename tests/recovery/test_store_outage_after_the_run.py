"""A store that fails as a task reads how its run left the thread, after a run longer
than the lease: that read waits for the store like every call of the run, and the task
ends as the run left the thread (handed over if the store stays down), never failed with
the store's error; a task whose thread failed fails with the thread's error.

The store is a private ``redis-server`` (AOF always), SIGKILLed at that read and, unless
it stays down, started again on the same data; the driver runs in this process
(``task.run``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Ignore, Retry

import agentq
from agentq import AgentTask, Run, Status
from agentq.records import ThreadMeta
from agentq.store.redis.store import RedisStore
from tests.support.redis_server import RedisServer

TTL = 1.0


class Overloaded(Exception):
    pass


class DownAtNextRead(RedisStore):
    """Once ``armed``, SIGKILLs its server as it next reads a thread's meta, and starts it
    again on the same data ``back_after`` seconds later (``None``: it stays down)."""

    server: RedisServer
    back_after: float | None
    armed = False
    restarting: threading.Timer | None = None

    def _do_meta(self, thread_id: str) -> ThreadMeta | None:
        if self.armed:
            self.armed = False
            self.server.kill()
            if self.back_after is not None:
                self.restarting = threading.Timer(self.back_after, self.server.start)
                self.restarting.start()
        return super()._do_meta(thread_id)


class SlowStepThenRetry(AgentTask):
    """A model call that outlasts the lease, then a provider's refusal: the thread is
    due again later, which the task reads back from the store to end ``RETRY``."""

    name = "tests.outage_after_run.slow_step"
    retry_on = (Overloaded,)
    store: DownAtNextRead

    def start(self, run: Run) -> Any:
        time.sleep(1.5 * TTL)  # the model's latency, longer than the lease
        self.store.armed = True
        raise Overloaded("the provider is overloaded")


class FailingStep(AgentTask):
    """A node that fails for good: the thread is failed, and the task fails with its error
    after reading the thread (for the result of its first task)."""

    name = "tests.outage_after_run.failing_step"
    store: DownAtNextRead

    def start(self, run: Run) -> Any:
        self.store.armed = True
        raise ValueError("the tool's arguments are malformed")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "store").start()
    try:
        yield server
    finally:
        server.stop()


def run_once(
    server: RedisServer,
    back_after: float | None,
    agent: type[AgentTask] = SlowStepThenRetry,
    ends_with: tuple[type[BaseException], ...] = (Retry, Ignore),
) -> tuple[pytest.ExceptionInfo[Any], ThreadMeta]:
    store = DownAtNextRead.from_url(server.url, prefix="after-run:")
    store.server, store.back_after = server, back_after
    app = Celery("after-run", broker="memory://", set_as_current=False)
    agentq.init_app(app, store=store, lease_ttl=TTL)
    task = app.register_task(agent())
    task.store = store
    store.open_thread("t1", task=task.name)
    try:
        with pytest.raises(ends_with) as ended:
            task.run("t1")
        if store.restarting is not None:
            store.restarting.join()
        else:
            server.start()
        meta = store.meta("t1")
        assert meta is not None
        return ended, meta
    finally:
        store.close()
        app.close()


def test_a_store_back_within_the_lease_ends_the_task_as_the_run_left_the_thread(
    server: RedisServer,
) -> None:
    ended, meta = run_once(server, back_after=0.3 * TTL)
    assert ended.type is Retry  # Celery's RETRY, read from the store once it was back
    assert (meta.status, meta.attempts, meta.crashes) == (Status.RETRYING, 1, 0)


def test_a_store_still_down_at_the_end_of_a_run_ends_the_task_handed_over(
    server: RedisServer,
) -> None:
    ended, meta = run_once(server, back_after=None)
    assert ended.type is Ignore  # HANDED_OVER: not the store's ConnectionError
    assert (meta.status, meta.attempts, meta.crashes) == (Status.RETRYING, 1, 0)


@pytest.mark.parametrize("back_after", [0.3 * TTL, None], ids=["back", "still-down"])
def test_a_failed_thread_fails_its_task_with_its_own_error_whatever_the_store_does(
    server: RedisServer, back_after: float | None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agentq")  # whatever an earlier test left it at
    ended, meta = run_once(server, back_after, FailingStep, (Exception,))
    assert ended.type is ValueError  # not the store's ConnectionError
    assert (meta.status, meta.attempts) == (Status.FAILED, 1)
    assert meta.error is not None and "the tool's arguments are malformed" in meta.error
    stayed_out = [r for r in caplog.records if "stayed unreachable after it" in r.getMessage()]
    assert len(stayed_out) == (0 if back_after else 1)
