"""Celery's own ways to stop a task stop a thread: a revoked or expired first message
cancels it, and ``agentq cancel`` and the inspector cancel as ``agent.cancel()`` does,
on an in-process worker with a real result backend."""

from __future__ import annotations

import gc
import json
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.result import AsyncResult
from celery.worker import state as worker_state
from click.testing import CliRunner

import agentq
from agentq import Done, FunctionAgent, Run
from agentq.celery.recovery import Sweeper
from agentq.celery.revoke import cancel_revoked_thread
from agentq.cli.entry import celery_command
from agentq.records import Status
from agentq.store.contract import Store
from tests.support.redis_server import RedisServer, wait_until

pytestmark = pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")

START_GRACE = 0.5
"""Short, so that a thread left queued is due soon after its countdown."""
COUNTDOWN = 2.0


@dataclass
class Env:
    app: Celery
    agent: FunctionAgent
    store: Store
    ran: list[str] = field(default_factory=list)
    """The threads whose first node ran."""


def define(app: Celery, ran: list[str]) -> FunctionAgent:
    agent = agentq.agent(app, "tests.revoke")

    @agent.node
    def start(run: Run, mode: str) -> Any:
        ran.append(run.thread_id)
        if mode == "fail_once" and ran.count(run.thread_id) == 1:
            raise ValueError("failing the first time")
        if mode == "wait":
            return Done(run.interrupt({"question": "refund 10?"}))
        return Done(mode)

    return agent


@pytest.fixture
def env(redis_broker: str, result_backend: str, redis_server: RedisServer) -> Iterator[Env]:
    prefix = f"rv{uuid.uuid4().hex[:8]}:"
    app = Celery("agentq-revoke", broker=redis_broker, backend=result_backend, set_as_current=False)
    app.conf.update(
        task_default_queue=f"agentq-test-{prefix}",
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    # The worker's own sweeper waits a minute before its first sweep: the tests sweep.
    runtime = agentq.init_app(
        app,
        store=redis_server.url,
        prefix=prefix,
        lease_ttl=5,
        start_grace=START_GRACE,
        sweep_interval=60,
    )
    ran: list[str] = []
    env = Env(app, define(app, ran), runtime.store, ran)
    with start_worker(
        app, pool="threads", concurrency=2, perform_ping_check=False, shutdown_timeout=30
    ):
        yield env
    # As in test_task_states: results unsubscribe from the backend when collected.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "unclosed <socket.socket", ResourceWarning)
        gc.collect()
    runtime.store.close()
    app.close()


def status_of(env: Env, thread_id: str) -> Status:
    return env.agent.thread(thread_id).status


def assert_stays_cancelled(env: Env, thread_id: str, first: AsyncResult, due_at: float) -> None:
    """Once the thread would have been due (its countdown and start grace over), a sweep
    does not send it again, it never ran, and its first task stays REVOKED."""
    wait_until(lambda: time.time() > due_at, timeout=COUNTDOWN + 10, what="the thread due")
    assert thread_id not in Sweeper(env.app).sweep_once()
    assert status_of(env, thread_id) == Status.CANCELLED
    assert thread_id not in env.ran
    assert AsyncResult(first.id, app=env.app).state == "REVOKED"


def test_revoking_a_delayed_thread_cancels_it(env: Env) -> None:
    sent_at = time.time()
    first = env.agent.apply_async(("rv-countdown",), {"mode": "fast"}, countdown=COUNTDOWN)
    first.revoke()
    # The worker holds the message until its countdown ends, then drops it as revoked.
    wait_until(
        lambda: status_of(env, "rv-countdown") == Status.CANCELLED,
        timeout=COUNTDOWN + 10,
        what="the thread cancelled",
    )
    assert first.state == "REVOKED"
    assert_stays_cancelled(env, "rv-countdown", first, sent_at + COUNTDOWN + START_GRACE)


def test_a_thread_whose_first_message_expires_is_cancelled(env: Env) -> None:
    sent_at = time.time()
    first = env.agent.apply_async(
        ("rv-expires",), {"mode": "fast"}, countdown=COUNTDOWN, expires=COUNTDOWN / 2
    )
    wait_until(
        lambda: status_of(env, "rv-expires") == Status.CANCELLED,
        timeout=COUNTDOWN + 10,
        what="the thread cancelled",
    )
    assert first.state == "REVOKED"
    assert_stays_cancelled(env, "rv-expires", first, sent_at + COUNTDOWN + START_GRACE)


def test_a_later_message_revoked_leaves_the_thread_to_recovery(env: Env) -> None:
    """A resume's message is one more send of the thread, not the thread: dropping it
    leaves the thread queued, and the sweeper sends it again."""
    first = env.agent.delay("rv-later", mode="wait")
    wait_until(lambda: status_of(env, "rv-later") == Status.WAITING, timeout=20, what="waiting")
    resumed = env.agent.resume("rv-later", "yes", countdown=COUNTDOWN)
    resumed.revoke()
    wait_until(lambda: resumed.state == "REVOKED", timeout=COUNTDOWN + 10, what="REVOKED")
    assert status_of(env, "rv-later") == Status.QUEUED
    wait_until(
        lambda: "rv-later" in Sweeper(env.app).sweep_once(), timeout=20, what="the thread re-sent"
    )
    assert first.get(timeout=20) == "yes"


def waiting_thread(env: Env, thread_id: str) -> AsyncResult:
    first = env.agent.delay(thread_id, mode="wait")
    wait_until(lambda: first.state == "WAITING", timeout=20, what="WAITING")
    return first


def test_agentq_cancel_with_the_app_revokes_the_first_task(env: Env) -> None:
    first = waiting_thread(env, "rv-cli")
    result = CliRunner().invoke(
        celery_command,
        ["cancel", "rv-cli", "--json"],
        obj=SimpleNamespace(app=env.app),  # as 'celery -A proj agentq cancel' runs it
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "thread_id": "rv-cli",
        "status": "cancelled",
        "was": "waiting",
        "task_revoked": True,
    }
    wait_until(lambda: first.state == "REVOKED", timeout=20, what="REVOKED")


def test_the_inspectors_cancel_with_the_app_revokes_the_first_task(env: Env) -> None:
    pytest.importorskip("starlette", reason="the inspector's extra is not installed: agentq[ui]")
    from agentq.ui.actions import ACTIONS, perform

    first = waiting_thread(env, "rv-ui")
    meta = env.store.meta("rv-ui")
    assert meta is not None
    perform(env.store, env.app, START_GRACE, ACTIONS["cancel"], {"id": "rv-ui"}, meta)
    assert status_of(env, "rv-ui") == Status.CANCELLED
    wait_until(lambda: first.state == "REVOKED", timeout=20, what="REVOKED")


def test_a_terminated_message_cancels_its_thread_whichever_it_was(env: Env) -> None:
    """``revoke(terminate=True)`` needs a pool that kills a task (prefork, gevent,
    eventlet): the handler is called here as the worker calls it then, for a message
    other than the first, which a plain revoke would only drop."""
    first = waiting_thread(env, "rv-killed")
    later = SimpleNamespace(id="not-the-first-task", args=("rv-killed",))
    cancel_revoked_thread(sender=env.agent, request=later, terminated=False, expired=False)
    assert status_of(env, "rv-killed") == Status.WAITING
    cancel_revoked_thread(sender=env.agent, request=later, terminated=True, expired=False)
    assert status_of(env, "rv-killed") == Status.CANCELLED
    wait_until(lambda: first.state == "REVOKED", timeout=20, what="REVOKED")


def test_an_expired_first_message_redelivered_leaves_a_started_thread_alone(env: Env) -> None:
    """With ``acks_late``, the first message of a run that was lost comes back when the
    broker redelivers it, maybe long after its ``expires``: the thread went on without it
    (here it waits for a person), and the expiry of that message does not cancel it."""
    first = waiting_thread(env, "rv-late")
    redelivered = SimpleNamespace(id=first.id, args=("rv-late",))
    cancel_revoked_thread(sender=env.agent, request=redelivered, terminated=False, expired=True)
    assert status_of(env, "rv-late") == Status.WAITING


@pytest.mark.parametrize("reopen", ["resume", "resume-by-sweeper", "retry", "retry-by-sweeper"])
def test_a_person_reopening_a_thread_outranks_a_revoke_of_its_first_task(
    env: Env, reopen: str
) -> None:
    """A later message honours a revoke of the first task while the thread has committed
    no step (a thread parked on its concurrency key is cancelled when woken), but not
    once a person reopened it: the thread asked, or failed, at its first node, so it has
    no step yet. A resume without the app (``agentq resume`` alone) is sent by a sweeper."""
    thread_id = f"rv-reopened-{reopen}"
    retried = reopen.startswith("retry")
    if retried:
        first = env.agent.delay(thread_id, mode="fail_once")
        wait_until(lambda: status_of(env, thread_id) == Status.FAILED, timeout=20, what="failed")
    else:
        first = waiting_thread(env, thread_id)
    first.revoke()
    wait_until(lambda: first.id in worker_state.revoked, timeout=20, what="the revoke received")
    if reopen == "retry":
        env.agent.retry_thread(thread_id)
    elif reopen == "resume":
        env.agent.resume(thread_id, "yes")
    elif reopen == "retry-by-sweeper":  # agentq retry without -A
        env.store.reopen(thread_id, from_statuses={Status.FAILED}, start_grace=0)
        assert thread_id in Sweeper(env.app).sweep_once()
    else:
        env.store.reopen(
            thread_id, from_statuses={Status.WAITING}, resume_value="yes", start_grace=0
        )
        assert thread_id in Sweeper(env.app).sweep_once()
    assert env.agent.wait(thread_id, timeout=20) == ("fail_once" if retried else "yes")
