"""What a drive does when something other than a node breaks it, and a cancel that meets a
wait for a human.

An error outside the nodes (a question the store cannot keep, a checkpoint it cannot
decode) fails the thread at once with that error and gives its lease up: left running,
it would go round recovery with the same error until its lost workers failed it under a
message about crashing workers. A report of progress that fails is not the thread's.
A cancel asked while a node runs stops the thread at the node's wait for a human."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.exceptions import Ignore, Retry

import agentq
from agentq import AgentTask, Done, Interrupt, Run, Status
from agentq.celery.drain import draining
from agentq.engine.lease import keeper_for
from agentq.errors import CodecError
from agentq.records import Checkpoint
from agentq.store.redis.store import RedisStore
from tests.support.redis_server import RedisServer, free_port, running_redis, wait_until


class AsksWithAnObject(AgentTask):
    """Asks a human a question msgpack cannot encode."""

    name = "tests.outside_nodes.asks_with_an_object"

    def start(self, run: Run) -> Any:
        return Done(run.interrupt({"approve": object()}))


class TwoSteps(AgentTask):
    name = "tests.outside_nodes.two_steps"
    reports: int = 0

    def start(self, run: Run) -> Any:
        return "finish"

    def finish(self, run: Run) -> Any:
        return Done("finished")

    def on_step(self, thread_id: str, step: int, node: str, *args: Any, **kwargs: Any) -> None:
        type(self).reports += 1
        raise ConnectionError("result backend unreachable")


def _call(n: int) -> int:
    return n


class ReportsItsLimitWait(AgentTask):
    """Its second call waits for its limit longer than ``limit_wait``; reporting that
    wait fails."""

    name = "tests.outside_nodes.reports_its_limit_wait"
    reports: int = 0

    def start(self, run: Run) -> Any:
        return Done([run.tool(_call, n, limit="slow") for n in range(2)])

    def on_limit_wait(self, *args: Any, **kwargs: Any) -> None:
        type(self).reports += 1
        raise ConnectionError("broker unreachable")


class CancelledWhileAsking(AgentTask):
    """A node during which an operator cancels the thread, and which then asks a human:
    through ``run.interrupt`` or by returning an :class:`Interrupt`."""

    name = "tests.outside_nodes.cancelled_while_asking"
    store: RedisStore | None = None

    def start(self, run: Run, returned: bool) -> Any:
        assert self.store is not None
        self.store.request_cancel(run.thread_id)
        if returned:
            return Interrupt({"question": "refund?"}, resume_at="finish")
        return Done(run.interrupt({"question": "refund?"}))

    def finish(self, run: Run) -> Any:
        return Done(run.resume_value)


class CancelledAsTheStoreRestarts(CancelledWhileAsking):
    """The report of its step that asked a human waits until the lease keeper has found
    the lease given up by that step's commit, then restarts the store's server: the
    cancel at the wait meets the store down for a moment."""

    name = "tests.outside_nodes.cancelled_as_the_store_restarts"
    server: RedisServer | None = None
    restarting: threading.Thread | None = None

    def on_step(self, thread_id: str, step: int, node: str, *args: Any, **kwargs: Any) -> None:
        assert self.server is not None
        keeper = keeper_for(self.agentq.store)
        wait_until(lambda: not keeper._leases, timeout=10, what="the lease dropped")
        self.server.kill()
        self.restarting = threading.Thread(target=self.server.start)
        self.restarting.start()


@pytest.fixture
def store(redis_server: RedisServer, request: pytest.FixtureRequest) -> Iterator[RedisStore]:
    store = RedisStore(redis.Redis(port=redis_server.port), prefix=f"{request.node.name}:")
    yield store
    store.close()


@pytest.fixture
def app(store: RedisStore) -> Iterator[Celery]:
    app = Celery("outside-nodes", broker="memory://", set_as_current=False)
    agentq.init_app(app, store=store, lease_ttl=5)
    yield app
    app.close()


def lock_held(store: RedisStore, thread_id: str) -> bool:
    return bool(store.client.exists(store.keys.lock(thread_id)))


def test_a_question_the_store_cannot_keep_fails_the_thread_with_its_error(
    app: Celery, store: RedisStore
) -> None:
    task = app.register_task(AsksWithAnObject())
    store.open_thread("t1", task=task.name)
    with pytest.raises(CodecError, match="approve"):
        task.run("t1")
    meta = store.meta("t1")
    assert meta is not None
    assert meta.status == Status.FAILED, meta.status
    assert "approve" in (meta.error or "") and "worker lost" not in (meta.error or "")
    assert meta.crashes == 0 and not lock_held(store, "t1")


def test_a_checkpoint_that_cannot_be_decoded_fails_the_thread_not_its_workers(
    app: Celery, store: RedisStore
) -> None:
    task = app.register_task(TwoSteps())
    store.open_thread("t1", task=task.name)
    token = store.acquire("t1", "w0", 5)
    store.commit("t1", token, Checkpoint(step=0, node="finish", token=token))
    store.set_status("t1", token, Status.QUEUED, due_in=0, release_owner="w0")
    store.client.set(store.keys.checkpoint("t1", 0), b"\xc1 not msgpack")
    with pytest.raises(CodecError) as raised:
        task.run("t1")
    meta = store.meta("t1")
    assert meta is not None
    assert meta.status == Status.FAILED and meta.crashes == 0 and not lock_held(store, "t1")
    assert type(raised.value).__name__ in (meta.error or "")
    # The run after it reports the failure, not a crashing step.
    with pytest.raises(Exception, match="failed") as again:
        task.run("t1")
    assert "worker lost" not in str(again.value)


def test_a_progress_report_that_fails_does_not_stop_the_thread(
    app: Celery, store: RedisStore
) -> None:
    task = app.register_task(TwoSteps())
    TwoSteps.reports = 0
    store.open_thread("t1", task=task.name)
    assert task.run("t1") == "finished"
    meta = store.meta("t1")
    assert meta is not None and meta.status == Status.DONE
    assert TwoSteps.reports == 2


def test_a_limit_wait_whose_report_fails_still_ends_the_task_as_a_retry(
    store: RedisStore,
) -> None:
    """The thread is parked until its limit allows the call; a report of that wait which
    fails must not fail the task (and run its errbacks) over a thread that is not."""
    app = Celery("outside-nodes", broker="memory://", set_as_current=False)
    slow = agentq.limit("slow", requests_per_minute=60, burst=1)
    agentq.init_app(app, store=store, lease_ttl=5, limits=[slow], limit_wait=0.1)
    try:
        task = app.register_task(ReportsItsLimitWait())
        ReportsItsLimitWait.reports = 0
        store.open_thread("t1", task=task.name)
        with pytest.raises(Retry):
            task.run("t1")
        meta = store.meta("t1")
        assert meta is not None and meta.status == Status.RETRYING, meta
        assert meta.attempts == 0 and not lock_held(store, "t1")
        assert ReportsItsLimitWait.reports == 1
    finally:
        app.close()


def test_a_hand_over_whose_message_cannot_be_sent_leaves_the_thread_to_recovery(
    store: RedisStore,
) -> None:
    """On a warm shutdown the thread is queued, due now, then sent on; a broker that does
    not take the message must not fail the task (and run its errbacks): the sweeper sends
    the thread, due in the store."""
    broker = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens: the send fails
    app = Celery("outside-nodes", broker=broker, set_as_current=False)
    app.conf.update(task_publish_retry=False, broker_transport_options={"max_retries": 0})
    agentq.init_app(app, store=store, lease_ttl=5)
    draining.set()  # as on a warm shutdown: the worker hands every thread on
    try:
        task = app.register_task(TwoSteps())
        store.open_thread("t1", task=task.name)
        with pytest.raises(Ignore):  # HANDED_OVER, as any hand-over
            task.run("t1")
        meta = store.meta("t1")
        assert meta is not None and meta.status == Status.QUEUED, meta
        assert not lock_held(store, "t1") and "t1" in dict(store.due(limit=10))
    finally:
        draining.clear()
        app.close()


def test_a_cancel_at_the_wait_outlasts_a_store_restart_after_the_lease_is_given_up(
    tmp_path: Path,
) -> None:
    """The step that asked a human gave its lease up; the cancel asked meanwhile is a
    write of the same drive, which waits out a passing store error as the others do,
    rather than leave the thread waiting for a human with the cancel unheeded."""
    with running_redis(tmp_path / "store") as server:
        store = RedisStore.from_url(server.url, prefix="cancel-restart:")
        app = Celery("outside-nodes", broker="memory://", set_as_current=False)
        agentq.init_app(app, store=store, lease_ttl=1.5)
        task = app.register_task(CancelledAsTheStoreRestarts())
        task.store, task.server = store, server
        try:
            # An Interrupt returned: committed with the step, which its report follows.
            store.open_thread("t1", task=task.name, input={"returned": True})
            with contextlib.suppress(Ignore):  # a cancelled thread's task is revoked
                task.run("t1")
            assert task.restarting is not None
            task.restarting.join(timeout=30)
            meta = store.meta("t1")
            assert meta is not None
            assert meta.status == Status.CANCELLED, meta.status
        finally:
            store.close()
            app.close()


@pytest.mark.parametrize("returned", [False, True], ids=["run.interrupt", "Interrupt"])
def test_a_cancel_asked_while_the_node_ran_stops_the_thread_at_its_wait(
    app: Celery, store: RedisStore, returned: bool
) -> None:
    task = app.register_task(CancelledWhileAsking())
    task.store = store
    store.open_thread("t1", task=task.name, input={"returned": returned})
    with contextlib.suppress(Ignore):  # a cancelled thread's task is revoked, not failed
        task.run("t1")
    meta = store.meta("t1")
    assert meta is not None
    assert meta.status == Status.CANCELLED, meta.status
    assert not lock_held(store, "t1")
    assert "t1" not in dict(store.due(limit=10))
