"""A store that stops answering for a moment costs threads time, never progress."""

from __future__ import annotations

import gc
import logging
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.result import AsyncResult

import agentq
from agentq import Status
from agentq.errors import StoreUnavailable
from agentq.store.contract import Store
from agentq.store.redis.store import RedisStore
from tests.support.agents import make_app
from tests.support.redis_server import RedisServer, running_redis, wait_until
from tests.support.threads_worker import statuses, threads_worker

THREADS = [f"t{n}" for n in range(10)]


def start_all(app: Celery, store: Store, *, steps: int, past_step: int) -> None:
    """Send every thread and wait until each has committed ``past_step``."""
    agent = app.tasks["tests.waiting_agent"]
    for thread_id in THREADS:
        agent.delay(thread_id, steps=steps, wait=0.25)
    wait_until(
        lambda: all(store.meta(t).step >= past_step for t in THREADS),  # type: ignore[union-attr]
        timeout=30,
        what=f"every thread past step {past_step}",
    )


def finished_untouched(store: Store) -> set[tuple[int, int, int]]:
    """Wait until every thread is done; their (crashes, fence, attempts), once each."""
    wait_until(
        lambda: set(statuses(store, THREADS).values()) == {Status.DONE},
        timeout=60,
        what="all threads done",
    )
    metas = [store.meta(t) for t in THREADS]
    return {(m.crashes, m.fence, m.attempts) for m in metas if m is not None}


def test_a_store_restart_mid_run_fails_no_thread_and_counts_no_crash(
    redis_broker: str, tmp_path: Path
) -> None:
    with (
        running_redis(tmp_path / "store") as server,
        threads_worker(redis_broker, server.url, concurrency=10, lease_ttl=8) as (app, store),
    ):
        start_all(app, store, steps=8, past_step=1)
        server.restart(down=1.5)  # SIGKILL, down, then back on its AOF
        # Each driver waited for the store and went on under its own lease: no takeover.
        assert finished_untouched(store) == {(0, 1, 0)}
        assert all(store.latest(t).state["left"] == 0 for t in THREADS)  # type: ignore[union-attr]


BUSY_SCRIPT = """
local stop_at = tonumber(redis.call('TIME')[1]) + tonumber(ARGV[1])
while tonumber(redis.call('TIME')[1]) < stop_at do end
return 1
"""


def test_a_busy_store_is_waited_for(redis_broker: str, tmp_path: Path) -> None:
    with (
        running_redis(tmp_path / "store", "--busy-reply-threshold", "50") as server,
        threads_worker(redis_broker, server.url, concurrency=10, lease_ttl=8) as (app, store),
    ):
        start_all(app, store, steps=6, past_step=0)
        # Another client's script holds the server for 2 s: every other command meets BUSY.
        busy = threading.Thread(
            target=lambda: redis.Redis(port=server.port).eval(BUSY_SCRIPT, 0, 2), daemon=True
        )
        busy.start()
        busy.join(timeout=30)
        assert finished_untouched(store) == {(0, 1, 0)}


class RetryLog(logging.Handler):
    """Sets ``retrying`` when a sender says it tries the store again."""

    def __init__(self) -> None:
        super().__init__()
        self.retrying = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "trying again in" in record.getMessage():
            self.retrying.set()


@pytest.fixture
def retry_log() -> Iterator[RetryLog]:
    handler, logger = RetryLog(), logging.getLogger("agentq")
    level = logger.level
    logger.setLevel(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def down_app(redis_broker: str, url: str) -> Celery:
    return make_app(
        broker=redis_broker,
        store=url,
        prefix="down:",
        queue="agentq-test-down",
        ledger_url=url,
    )


def test_delay_waits_for_a_store_back_within_the_publish_retry_policy(
    redis_broker: str, tmp_path: Path, retry_log: RetryLog
) -> None:
    with running_redis(tmp_path / "store") as server:
        app = down_app(redis_broker, server.url)
        agent = app.tasks["tests.waiting_agent"]
        policy = {
            "max_retries": 300,
            "interval_start": 0.1,
            "interval_max": 0.1,
            "retry_errors": (OSError,),  # the broker's, given to Celery alone
        }
        sent: list[AsyncResult] = []
        try:
            server.kill()
            sender = threading.Thread(
                target=lambda: sent.append(
                    agent.apply_async(("t1",), {"steps": 1, "wait": 0}, retry_policy=policy)
                )
            )
            sender.start()
            assert retry_log.retrying.wait(30), "the sender never met the store down"
            server.start()
            sender.join(timeout=60)
            (result,) = sent
            meta = agent.thread("t1")
            assert (meta.status, meta.origin, meta.input) == (
                Status.QUEUED,
                result.id,
                {"steps": 1, "wait": 0},
            )
        finally:
            app._agentq_runtime.store.close()
            app.close()


@pytest.mark.parametrize("options", [{}, {"retry": False}], ids=["default policy", "no retry"])
def test_delay_while_the_store_stays_down_raises_store_unavailable(
    redis_broker: str, tmp_path: Path, retry_log: RetryLog, options: dict[str, Any]
) -> None:
    with running_redis(tmp_path / "store") as server:
        app = down_app(redis_broker, server.url)
        agent = app.tasks["tests.waiting_agent"]
        try:
            server.kill()
            with pytest.raises(StoreUnavailable, match=r"'t1'.*cannot reach the store") as raised:
                agent.apply_async(("t1",), {"steps": 1, "wait": 0}, **options)
            # Celery's default policy tries a publish three more times; so does the store.
            assert retry_log.retrying.is_set() is ("retry" not in options)
            with pytest.raises(StoreUnavailable):
                agent.thread("t1")
        finally:
            app._agentq_runtime.store.close()
            app.close()
    assert isinstance(raised.value.__cause__, redis.ConnectionError)


class RestartsAtCanvas(RedisStore):
    """The store, whose server restarts just as the first task asks it whether it carries
    the thread's canvas on (the first round trip after the thread's last commit)."""

    server: RedisServer
    restarted: threading.Event

    def _do_take_canvas(self, thread_id: str, taker: str) -> bool:
        if not self.restarted.is_set():
            self.restarted.set()
            self.server.kill()
            threading.Thread(target=self.server.start, daemon=True).start()
        return super()._do_take_canvas(thread_id, taker)


def test_a_store_restart_as_a_thread_ends_still_ends_its_task_with_the_result(
    redis_broker: str, result_backend: str, tmp_path: Path
) -> None:
    with running_redis(tmp_path / "store") as server:
        store = RestartsAtCanvas.from_url(server.url, prefix="canvas:")
        store.server, store.restarted = server, threading.Event()
        app = Celery("store-at-canvas", broker=redis_broker, backend=result_backend)
        app.conf.update(
            task_default_queue="agentq-test-store-at-canvas",
            worker_hijack_root_logger=False,
            broker_connection_retry_on_startup=True,
        )
        agentq.init_app(app, store=store, lease_ttl=10, sweep_interval=0.5)
        agent = agentq.agent(app, "tests.store_at_canvas")
        callbacks: list[Any] = []

        @agent.node
        def start(run: Any) -> Any:
            return agentq.Done("finished")

        @app.task(name="tests.store_at_canvas.callback", shared=False)
        def callback(result: Any) -> None:
            callbacks.append(result)

        try:
            with start_worker(
                app, pool="threads", concurrency=1, perform_ping_check=False, shutdown_timeout=30
            ):
                first = agent.apply_async(("t1",), link=callback.s())
                # The store came back within the lease: the task ends as its thread did.
                assert first.get(timeout=30) == "finished"
                assert store.restarted.is_set()
                wait_until(lambda: callbacks == ["finished"], timeout=20, what="the callback")
            assert agent.thread("t1").status == Status.DONE
        finally:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "unclosed <socket.socket", ResourceWarning)
                gc.collect()
            store.close()
            app.close()
