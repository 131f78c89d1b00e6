"""Celery's view of a thread, on an in-process worker with a real result backend and a
real event receiver: a task that leaves its thread unfinished says why, and the result of
the first ``delay()`` ends with the thread's, whichever task finished it."""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from celery import Celery, Task
from celery.contrib.testing.worker import start_worker
from celery.result import AsyncResult
from celery.signals import task_postrun

import agentq
from agentq import Done, FunctionAgent, Run, Status
from agentq.celery.drain import draining
from agentq.celery.task_outcome import HANDED_OVER, NEEDS_ATTENTION, WAITING, WAITING_FOR_KEY
from agentq.errors import InterruptTimedOut, NeedsAttention
from tests.support.agents import RateLimitError
from tests.support.redis_server import RedisServer, wait_until

pytestmark = pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")

EVENTS = (
    "task-waiting",
    "task-retrying",
    "task-handed-over",
    "task-needs-attention",
    "task-waiting-for-key",
)


@dataclass
class Env:
    app: Celery
    agent: FunctionAgent
    retried: list[tuple[str, BaseException]]
    events: list[dict[str, Any]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    entered: threading.Event = field(default_factory=threading.Event)


def define_keyed(app: Celery, release: threading.Event) -> FunctionAgent:
    """An agent whose threads share the concurrency key ``solo`` (one at a time)."""
    agent = agentq.agent(app, "tests.states.keyed", concurrency_key="solo")

    @agent.node
    def start(run: Run, hold: bool) -> Any:
        if hold:
            release.wait(20)
        return Done(run.thread_id)

    return agent


def define_quiet(app: Celery, entered: threading.Event, release: threading.Event) -> None:
    """An agent whose results are ignored; its second node holds until ``release``."""
    agent = agentq.agent(app, "tests.states.quiet", ignore_result=True)

    @agent.node
    def start(run: Run) -> Any:
        return "finish"

    @agent.node
    def finish(run: Run) -> Any:
        entered.set()
        release.wait(20)
        return Done("quiet")


def define_asking_later(app: Celery) -> None:
    """An agent that asks a human at its second step, its first one committed."""
    agent = agentq.agent(app, "tests.states.asks_later")

    @agent.node
    def start(run: Run) -> Any:
        return "ask"

    @agent.node
    def ask(run: Run) -> Any:
        return Done(run.interrupt({"question": "refund 10?"}))


def define_answered_at_once(app: Celery) -> FunctionAgent:
    """An agent whose question is answered, or its thread cancelled, as soon as its
    ``task-waiting`` event is sent (as by a program that listens to the events), and the
    thread ended, before its first task stores its ``WAITING`` state."""

    def send_event(self: Any, type_: str, **fields: Any) -> Any:
        thread_id = fields.get("thread_id")
        if type_ == "task-waiting" and self.request.id == self.thread(thread_id).origin:
            origin = self.request.id
            if thread_id.startswith("cancel"):
                act = functools.partial(self.cancel, thread_id)
            else:
                act = functools.partial(self.resume, thread_id, "no")
            acting = threading.Thread(target=act)  # from outside the task, as a program
            acting.start()
            acting.join(20)
            wait_until(
                lambda: AsyncResult(origin, app=app).state in ("FAILURE", "REVOKED"),
                timeout=20,
                what=f"{thread_id} ended under its first task's id",
            )
        return Task.send_event(self, type_, **fields)

    agent = agentq.agent(app, "tests.states.answered_at_once", send_event=send_event)

    @agent.node
    def start(run: Run) -> Any:
        raise ValueError(f"refused: {run.interrupt({'question': 'refund 10?'})}")

    return agent


def define(app: Celery, retried: list[tuple[str, BaseException]]) -> FunctionAgent:
    def on_retry(self: Any, exc: BaseException, task_id: str, *args: Any) -> None:
        retried.append((task_id, exc))

    agent = agentq.agent(app, "tests.states", retry_on=(RateLimitError,), on_retry=on_retry)
    first_attempts: set[str] = set()

    @agent.node
    def start(run: Run, mode: str) -> Any:
        if mode == "wait":
            return Done({"approved": run.interrupt({"question": "refund 10?"})})
        if mode == "choose":  # a set: agentq's codec keeps it, JSON has no such type
            return Done({"chosen": run.interrupt({"question": "which?", "options": {"a", "b"}})})
        if mode == "deadline":
            try:
                return Done({"approved": run.interrupt({"question": "refund 10?"}, timeout=1)})
            except InterruptTimedOut as exc:
                return Done({"timed_out": exc.timeout})
        if mode == "retry" and run.thread_id not in first_attempts:
            first_attempts.add(run.thread_id)
            raise RateLimitError(retry_after="0.2")
        if mode == "attention":
            raise NeedsAttention(
                "a person must look", thread_id=run.thread_id, step=0, key="k", tool="t"
            )
        if mode == "fail":
            raise ValueError("the model said no")
        return Done(mode)

    return agent


@pytest.fixture
def env(redis_broker: str, result_backend: str, redis_server: RedisServer) -> Iterator[Env]:
    prefix = f"st{uuid.uuid4().hex[:8]}:"
    app = Celery("agentq-states", broker=redis_broker, backend=result_backend, set_as_current=False)
    app.conf.update(
        task_default_queue=f"agentq-test-{prefix}",
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        worker_send_task_events=True,
    )
    agentq.init_app(
        app,
        store=redis_server.url,
        prefix=prefix,
        lease_ttl=5,
        start_grace=5,
        sweep_interval=0.1,
        limits=[agentq.limit("solo", threads=1)],
    )
    retried: list[tuple[str, BaseException]] = []
    env = Env(app, define(app, retried), retried)
    define_keyed(app, env.release)
    define_quiet(app, env.entered, env.release)
    define_asking_later(app)
    define_answered_at_once(app)
    listening = threading.Event()
    receivers: list[Any] = []

    def listen() -> None:
        handlers = {name: env.events.append for name in (*EVENTS, "task-revoked")}
        with app.connection_for_read() as connection:
            receiver = app.events.Receiver(connection, handlers=handlers)
            receivers.append(receiver)
            receiver.on_consume_ready = lambda *args, **kwargs: listening.set()
            with contextlib.suppress(TimeoutError, OSError):
                for _ in receiver.itercapture(limit=None, timeout=120, wakeup=False):
                    pass

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert listening.wait(10)
    with start_worker(
        app, pool="threads", concurrency=2, perform_ping_check=False, shutdown_timeout=30
    ):
        yield env
    env.release.set()
    # Results unsubscribe from the backend when collected: now, while it still runs. With
    # redis-py 8.2, the result consumer of a thread's own backend (the sweeper re-sent a
    # thread from one) leaves its pubsub socket for the collector to close.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "unclosed <socket.socket", ResourceWarning)
        gc.collect()
    receivers[0].should_stop = True  # seen within a second, at the next poll
    listener.join(10)
    app._agentq_runtime.store.close()
    app.close()


def event_of(env: Env, type_: str, thread_id: str) -> dict[str, Any]:
    wait_until(
        lambda: any(e["type"] == type_ and e.get("thread_id") == thread_id for e in env.events),
        timeout=20,
        what=f"{type_} for {thread_id}",
    )
    return next(e for e in env.events if e["type"] == type_ and e.get("thread_id") == thread_id)


def test_an_agent_that_ignores_its_results_stores_no_progress(env: Env) -> None:
    quiet = env.app.tasks["tests.states.quiet"]
    first = quiet.delay("t-quiet")
    assert env.entered.wait(20)  # step 0 committed and reported
    assert first.state == "PENDING"
    env.release.set()
    assert quiet.wait("t-quiet", timeout=20) == "quiet"


def test_a_thread_waiting_for_a_human_is_waiting_and_get_ends_with_its_result(env: Env) -> None:
    first = env.agent.delay("t1", mode="wait")
    wait_until(lambda: first.state == WAITING, timeout=20, what="WAITING")
    assert first.info["thread_id"] == "t1"
    assert first.info["interrupt"] == {"question": "refund 10?"}
    assert not first.ready()
    assert event_of(env, "task-waiting", "t1")["interrupt"] == {"question": "refund 10?"}
    resumed = env.agent.resume("t1", True)
    assert resumed.get(timeout=20) == {"approved": True}
    assert first.get(timeout=20) == {"approved": True}
    assert AsyncResult(first.id, app=env.app).state == "SUCCESS"


def test_a_wait_with_a_timeout_says_when_it_ends_and_get_ends_with_its_timeout(
    env: Env,
) -> None:
    before = time.time()
    first = env.agent.delay("t-deadline", mode="deadline")
    assert first.get(timeout=20) == {"timed_out": 1}
    event = event_of(env, "task-waiting", "t-deadline")
    assert before + 1 <= event["timeout_at"] <= time.time()
    assert event["interrupt"] == {"question": "refund 10?"}


def test_a_retry_after_is_celerys_retry_and_on_retry_fires(env: Env) -> None:
    first = env.agent.delay("t2", mode="retry")
    assert first.get(timeout=20) == "retry"
    [(task_id, exc)] = env.retried
    assert task_id == first.id and isinstance(exc, RateLimitError)
    event = event_of(env, "task-retrying", "t2")
    assert event["due_at"] > 0 and "RateLimitError" in event["error"]


def test_a_question_celery_cannot_encode_leaves_the_task_waiting_not_failed(env: Env) -> None:
    """The thread's question goes into the task's WAITING state and event, which Celery
    encodes as JSON; a question JSON cannot hold (a set, which agentq stores) must not
    fail the task (and run its errbacks) while its thread waits for the answer."""
    ended = threading.Event()

    def on_postrun(task_id: str | None = None, **_: Any) -> None:
        if task_id == first.id:
            ended.set()

    task_postrun.connect(on_postrun, weak=False)
    try:
        first = env.agent.delay("t-set", mode="choose")
        assert ended.wait(20), "the first task did not end"
    finally:
        task_postrun.disconnect(on_postrun)
    assert env.agent.thread("t-set").status == Status.WAITING
    assert first.state != "FAILURE", first.result
    env.agent.resume("t-set", "a")
    assert first.get(timeout=20) == {"chosen": "a"}


def test_a_handed_over_thread_is_handed_over_until_another_task_ends_it(env: Env) -> None:
    draining.set()  # as on a warm shutdown: the worker hands every thread on
    try:
        first = env.agent.delay("t3", mode="fast")
        wait_until(lambda: first.state == HANDED_OVER, timeout=20, what="HANDED_OVER")
        assert first.info["thread_id"] == "t3"
        event_of(env, "task-handed-over", "t3")
    finally:
        draining.clear()
    assert first.get(timeout=20) == "fast"


def test_needs_attention_and_a_failed_thread_say_so(env: Env) -> None:
    stuck = env.agent.delay("t4", mode="attention")
    wait_until(lambda: stuck.state == NEEDS_ATTENTION, timeout=20, what="NEEDS_ATTENTION")
    assert "a person must look" in stuck.info["error"]
    event_of(env, "task-needs-attention", "t4")
    failing = env.agent.delay("t5", mode="fail")
    with pytest.raises(ValueError, match="the model said no"):
        failing.get(timeout=20)


def test_a_thread_whose_checkpoint_is_gone_needs_attention_in_celery_too(
    env: Env, redis_server: RedisServer
) -> None:
    agent = env.app.tasks["tests.states.asks_later"]
    agent.delay("t-lost")
    wait_until(lambda: agent.thread("t-lost").status == Status.WAITING, timeout=20, what="waiting")
    prefix = env.app._agentq_runtime.settings.prefix
    with redis_server.client() as client:  # what an evicting server drops, by hand
        client.delete(*client.keys(f"{prefix}thread:{{t-lost}}:checkpoint:*"))
    resumed = agent.resume("t-lost", True)
    wait_until(lambda: resumed.state == NEEDS_ATTENTION, timeout=20, what="NEEDS_ATTENTION")
    assert "data loss" in resumed.info["error"]
    assert event_of(env, "task-needs-attention", "t-lost")["error"] == resumed.info["error"]


def test_a_cancelled_thread_revokes_the_first_task(env: Env) -> None:
    first = env.agent.delay("t6", mode="wait")
    wait_until(lambda: first.state == WAITING, timeout=20, what="WAITING")
    env.agent.cancel("t6")
    wait_until(lambda: first.state == "REVOKED", timeout=20, what="REVOKED")


def test_a_thread_waiting_for_its_concurrency_key_says_which_until_it_runs(env: Env) -> None:
    keyed = env.app.tasks["tests.states.keyed"]
    holder = keyed.delay("t7", hold=True)
    wait_until(lambda: keyed.thread("t7").status == "running", timeout=20, what="the slot held")
    parked = keyed.delay("t8", hold=False)
    wait_until(lambda: parked.state == WAITING_FOR_KEY, timeout=20, what="WAITING_FOR_KEY")
    assert parked.info["concurrency_key"] == "solo" and parked.info["position"] == 1
    assert not parked.ready()
    assert event_of(env, "task-waiting-for-key", "t8")["concurrency_key"] == "solo"
    env.release.set()
    assert holder.get(timeout=20) == "t7"
    assert parked.get(timeout=20) == "t8"


def test_the_first_tasks_result_keeps_its_name_and_arguments_whichever_task_ends_it(
    env: Env,
) -> None:
    """With ``result_extended``, the first task's stored result names its task and
    arguments, as its ``WAITING`` state did, when a later task (a resume) or a ``cancel()``
    outside any task ends its thread."""
    env.app.conf.result_extended = True  # read by the backend at each write
    answered = env.agent.delay("t-ext", mode="wait")
    cancelled = env.agent.delay("t-ext-cancelled", mode="wait")
    wait_until(
        lambda: answered.state == cancelled.state == WAITING, timeout=20, what="both WAITING"
    )
    env.agent.resume("t-ext", True)
    assert answered.get(timeout=20) == {"approved": True}
    env.agent.cancel("t-ext-cancelled")
    wait_until(lambda: cancelled.state == "REVOKED", timeout=20, what="REVOKED")
    for first, thread_id in ((answered, "t-ext"), (cancelled, "t-ext-cancelled")):
        stored = AsyncResult(first.id, app=env.app)
        assert (stored.name, stored.args, stored.kwargs) == ("tests.states", [thread_id], {})


def test_cancel_with_an_rpc_backend_cancels_without_an_error(
    redis_broker: str, redis_server: RedisServer
) -> None:
    """``rpc://`` sends a result to the reply queue of the message being run, and a
    ``cancel()`` outside any task runs none: it has nowhere to send the first task's
    ``REVOKED``, and must not fail after the store cancelled the thread."""
    app = Celery("agentq-states-rpc", broker=redis_broker, backend="rpc://", set_as_current=False)
    app.conf.update(task_default_queue=f"agentq-test-{uuid.uuid4().hex[:8]}")
    runtime = agentq.init_app(app, store=redis_server.url, prefix=f"sr{uuid.uuid4().hex[:8]}:")
    agent = define(app, [])
    try:
        agent.delay("t-rpc", mode="wait")  # no worker: the thread stays queued
        assert agent.cancel("t-rpc") == Status.CANCELLED
        assert agent.thread("t-rpc").status == Status.CANCELLED
    finally:
        runtime.store.close()
        app.close()


def test_a_thread_ended_as_soon_as_it_waits_is_not_hidden_by_its_waiting_state(
    env: Env,
) -> None:
    """A thread failed (after an answer) or cancelled the moment it waits for a human
    has its end stored under its first task id before that task stores ``WAITING``: the
    first task's ``get()`` ends with the thread's end, not waits for ever."""
    agent = env.app.tasks["tests.states.answered_at_once"]
    ended: set[str] = set()

    def on_postrun(task_id: str | None = None, **_: Any) -> None:
        ended.add(task_id or "")

    task_postrun.connect(on_postrun, weak=False)
    try:
        failed = agent.delay("fail-at-once")
        cancelled = agent.delay("cancel-at-once")
        wait_until(lambda: {failed.id, cancelled.id} <= ended, timeout=30, what="both ended")
    finally:
        task_postrun.disconnect(on_postrun)
    assert agent.thread("fail-at-once").status == Status.FAILED
    assert agent.thread("cancel-at-once").status == Status.CANCELLED
    # What the first tasks stored last is what a caller that did not send them reads
    # (the sender's own result may have heard of the end as it was published).
    reader = Celery("agentq-states-reader", backend=env.app.conf.result_backend)
    try:
        assert AsyncResult(failed.id, app=reader).state == "FAILURE"
        assert AsyncResult(cancelled.id, app=reader).state == "REVOKED"
        with pytest.raises(ValueError, match="refused: no"):
            AsyncResult(failed.id, app=reader).get(timeout=20)
    finally:
        reader.close()


def test_get_of_a_second_delay_of_an_unfinished_thread_ends_with_the_thread(env: Env) -> None:
    """``delay()`` is idempotent by thread id (a web request retried, a job run twice): the
    AsyncResult the second call returns ends when the thread does, as a plain task's
    second ``delay()`` would."""
    ran: list[str] = []

    def record(task_id: str | None = None, **_: Any) -> None:
        ran.append(str(task_id))

    task_postrun.connect(record, weak=False)
    try:
        first = env.agent.delay("t-again", mode="wait")
        wait_until(lambda: first.state == WAITING, timeout=20, what="WAITING")
        second = env.agent.delay("t-again", mode="wait")
        wait_until(lambda: second.id in ran, timeout=20, what="the second message run")
        env.agent.resume("t-again", True)
        assert first.get(timeout=20) == {"approved": True}
    finally:
        task_postrun.disconnect(record)
    # The thread is done and no message of it is left: nothing will store another state
    # under the second id, so its get() would wait for ever.
    assert AsyncResult(second.id, app=env.app).state == "SUCCESS"


def test_a_delay_of_a_finished_thread_returns_its_own_message_which_gets_the_end(
    env: Env,
) -> None:
    # The first task's result may have expired since: the new message stores the end anew.
    first = env.agent.delay("t-over", mode="wait")
    wait_until(lambda: first.state == WAITING, timeout=20, what="WAITING")
    env.agent.resume("t-over", True)
    assert first.get(timeout=20) == {"approved": True}
    env.app.backend.forget(first.id)
    again = env.agent.delay("t-over", mode="wait")
    assert again.id != first.id
    assert again.get(timeout=20) == {"approved": True}
