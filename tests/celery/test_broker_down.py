"""Sending a thread on again while the broker refuses every connection: the store's change
stands, so the caller is told the thread is queued and who sends it, not only that the
broker failed (a caller who took that for a failed resume would ask again, and be refused)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import kombu.exceptions
import pytest
from celery import Celery

from agentq.errors import MessageNotSent, ThreadStateError
from agentq.records import Checkpoint, Status
from agentq.store.contract import Store
from tests.support.agents import make_app
from tests.support.redis_server import RedisServer, free_port

OWNER = "broker-down-test"


@pytest.fixture
def app(redis_server: RedisServer) -> Iterator[Celery]:
    prefix = f"bd{uuid.uuid4().hex[:8]}:"
    app = make_app(
        broker=f"redis://127.0.0.1:{free_port()}/0",  # nothing listens there
        store=redis_server.url,
        prefix=prefix,
        queue=f"agentq-test-{prefix}",
        ledger_url=redis_server.url,
        start_grace=7,
    )
    yield app
    app._agentq_runtime.store.close()
    app.close()


def stopped(store: Store, thread_id: str, status: Status, *, claimed: str | None = None) -> None:
    """A thread whose worker committed step 0, claimed ``claimed`` (its outcome never
    recorded), and stopped it in ``status``."""
    store.open_thread(thread_id, task="tests.approval_agent", input={"amount": 5})
    token = store.acquire(thread_id, OWNER, 30)
    checkpoint = Checkpoint(step=0, node="ask", state={"amount": 5}, task="tests.approval_agent")
    store.commit(thread_id, token, checkpoint)
    if claimed is not None:
        store.claim_effect(thread_id, claimed, token, tool="refund")
    store.set_status(thread_id, token, status, error="boom", release_owner=OWNER)


def test_resume_retry_and_settle_say_the_thread_is_queued_when_the_send_fails(
    app: Celery,
) -> None:
    agent = app.tasks["tests.approval_agent"]
    store: Store = app._agentq_runtime.store
    stopped(store, "t-wait", Status.WAITING)
    stopped(store, "t-failed", Status.FAILED)
    stopped(store, "t-stuck", Status.NEEDS_ATTENTION, claimed="call-1")

    calls = {
        "t-wait": lambda: agent.resume("t-wait", {"approved": True}),
        "t-failed": lambda: agent.retry_thread("t-failed"),
        "t-stuck": lambda: agent.resolve_effect("t-stuck", "call-1", did_not_run=True),
    }
    for thread_id, call in calls.items():
        with pytest.raises(MessageNotSent) as told:
            call()
        assert (told.value.thread_id, told.value.status) == (thread_id, "queued")
        assert isinstance(told.value.__cause__, kombu.exceptions.OperationalError)
        for fragment in ("queued again", "not sent", "sweeper", "in 7 s", "refused"):
            assert fragment in str(told.value), str(told.value)
        meta = store.meta(thread_id)
        assert meta is not None and meta.status == Status.QUEUED
        # As the error says: asking again is refused.
        with pytest.raises(ThreadStateError):
            call()
    assert store.meta("t-wait").resume_value == {"approved": True}  # type: ignore[union-attr]
    assert store.effect("t-stuck", "call-1") is None


def test_a_delay_whose_send_fails_says_the_thread_will_run(app: Celery) -> None:
    """Celery's ``delay()`` that raises sent nothing: nothing runs. agentq's stores the
    thread first, and it stays queued for a sweeper to send: the caller is told so, not
    handed an error that says the opposite (a caller that sent the work another way would
    have the agent's tools run twice). Sending it again is the same thread, told the same."""
    agent = app.tasks["tests.approval_agent"]
    store: Store = app._agentq_runtime.store
    for _ in range(2):
        with pytest.raises(MessageNotSent) as told:
            agent.delay("t-new", amount=5)
        assert (told.value.thread_id, told.value.status) == ("t-new", "queued")
        assert isinstance(told.value.__cause__, kombu.exceptions.OperationalError)
        for fragment in ("not sent", "sweeper", "not lost", "delay() is safe"):
            assert fragment in str(told.value), str(told.value)
        meta = store.meta("t-new")
        assert meta is not None and meta.status == Status.QUEUED and meta.runs_by_itself
        assert meta.input == {"amount": 5}


def test_a_delay_of_a_finished_thread_whose_send_fails_raises_the_brokers_error(
    app: Celery,
) -> None:
    # Nothing runs by itself there: the broker's error says all.
    store: Store = app._agentq_runtime.store
    stopped(store, "t-failed", Status.FAILED)
    with pytest.raises(kombu.exceptions.OperationalError):
        app.tasks["tests.approval_agent"].delay("t-failed", amount=5)
