"""A wait for a human with a timeout, on an in-process worker and each store: the timeout
runs the thread on by itself (the sweeper sends it when it is due), a resume in time wins,
and a bad timeout fails the thread saying what to pass."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

import agentq
from agentq import AgentTask, Done, Interrupt, Run, Status
from agentq.errors import InterruptTimedOut, ThreadStateError
from agentq.store.contract import Store
from tests.support.redis_server import RedisServer, wait_until

ASK = {"question": "refund 30?"}
THEN = {"question": "anything else?"}


class DeadlineAgent(AgentTask):
    """Asks ``ASK`` with a timeout in the way ``style`` says: ``call`` (``run.interrupt``
    in a plain node), ``async`` (the same in an ``async def`` node) or ``outcome``
    (returning ``Interrupt``); a timeout ends it with what the exception carried, unless
    ``catch`` is false. An answer leads to ``THEN``, a second wait without a timeout."""

    name = "tests.deadline_agent"

    def start(self, run: Run, timeout: Any, style: str = "call", catch: bool = True) -> str:
        run.state.update(timeout=timeout, catch=catch)
        return {"call": "ask", "async": "ask_async", "outcome": "ask_outcome"}[style]

    def ask(self, run: Run) -> Any:
        try:
            answer = run.interrupt(ASK, timeout=run.state["timeout"])
        except InterruptTimedOut as exc:
            return self._timed_out(run, exc)
        return self._answered(run, answer)

    async def ask_async(self, run: Run) -> Any:
        try:
            answer = run.interrupt(ASK, timeout=run.state["timeout"])
        except InterruptTimedOut as exc:
            return self._timed_out(run, exc)
        return self._answered(run, answer)

    def ask_outcome(self, run: Run) -> Interrupt:
        return Interrupt(ASK, resume_at="decide", timeout=run.state["timeout"])

    def decide(self, run: Run) -> Any:
        try:
            answer = run.resume_value
        except InterruptTimedOut as exc:
            return self._timed_out(run, exc)
        return self._answered(run, answer)

    def finish(self, run: Run) -> Done:
        return Done({"answer": run.state["answer"], "then": run.resume_value})

    def _answered(self, run: Run, answer: Any) -> Interrupt:
        run.state["answer"] = answer
        return Interrupt(THEN, resume_at="finish")

    def _timed_out(self, run: Run, exc: InterruptTimedOut) -> Done:
        if not run.state["catch"]:
            raise exc
        return Done({"timed_out": exc.payload, "after": exc.timeout, "step": exc.step})


@dataclass
class Env:
    app: Celery
    store: Store
    agent: Any
    plain: Any


def _fn_agent(app: Celery) -> Any:
    """The function form, with a timeout given as a timedelta."""
    plain = agentq.agent(app, "tests.fn_deadline")

    @plain.node
    def start(run: Run) -> Done:
        try:
            return Done(run.interrupt(ASK, timeout=datetime.timedelta(milliseconds=300)))
        except InterruptTimedOut as exc:
            return Done({"timed_out": exc.payload, "after": exc.timeout})

    return plain


def worker(app: Celery) -> Any:
    return start_worker(
        app, pool="threads", concurrency=2, perform_ping_check=False, shutdown_timeout=30
    )


@pytest.fixture(params=["redis", "sqlite"])
def env(
    request: pytest.FixtureRequest, redis_broker: str, redis_server: RedisServer, tmp_path: Path
) -> Iterator[Env]:
    app, store = make(request.param, redis_broker, redis_server, tmp_path)
    with worker(app):
        yield Env(app, store, app.tasks[DeadlineAgent.name], app.tasks["tests.fn_deadline"])
    store.close()
    app.close()


def make(
    backend: str, redis_broker: str, redis_server: RedisServer, tmp_path: Path
) -> tuple[Celery, Store]:
    prefix = f"wt{uuid.uuid4().hex[:8]}:"
    app = Celery("agentq-wait-timeout", broker=redis_broker, set_as_current=False)
    app.conf.update(
        task_default_queue=f"agentq-test-{prefix}",
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    url = redis_server.url if backend == "redis" else f"sqlite:///{tmp_path / 'a.db'}"
    agentq.init_app(app, store=url, prefix=prefix, lease_ttl=3, start_grace=5, sweep_interval=0.1)
    app.register_task(DeadlineAgent())
    _fn_agent(app)
    return app, app._agentq_runtime.store


def finished(env: Env, thread_id: str, agent: Any = None) -> Any:
    """The thread's meta once it is done or failed (``wait()`` would stop at its wait)."""
    agent = agent or env.agent
    return wait_until(
        lambda: (m := agent.thread(thread_id)).status in (Status.DONE, Status.FAILED) and m,
        timeout=20,
        what=f"{thread_id} finished",
    )


@pytest.mark.parametrize("style", ["call", "async", "outcome"])
def test_a_timeout_takes_the_nodes_other_path_and_the_thread_finishes(env: Env, style: str) -> None:
    env.agent.delay("t1", timeout=0.3, style=style)
    meta = finished(env, "t1")
    step = 1 if style != "outcome" else 2  # the node that sees the timeout
    assert (meta.status, meta.result) == (
        Status.DONE,
        {"timed_out": ASK, "after": 0.3, "step": step},
    )
    assert not meta.timed_out and meta.timeout is None
    with pytest.raises(ThreadStateError, match="done"):
        env.agent.resume("t1", "too late")


def test_the_function_form_times_out_too(env: Env) -> None:
    env.plain.delay("f1")
    meta = finished(env, "f1", env.plain)
    assert meta.result == {"timed_out": ASK, "after": 0.3}


@pytest.mark.parametrize("style", ["call", "outcome"])
def test_an_uncaught_timeout_fails_the_thread_with_it(env: Env, style: str) -> None:
    env.agent.delay("t2", timeout=0.3, style=style, catch=False)
    meta = finished(env, "t2")
    assert meta.status == Status.FAILED
    assert (meta.error or "").startswith("InterruptTimedOut: thread 't2', step ")
    assert "within 0.3 s" in (meta.error or "")
    with pytest.raises(ThreadStateError, match="failed"):  # a late answer is refused
        env.agent.resume("t2", "too late")


@pytest.mark.parametrize("style", ["call", "outcome"])
def test_a_resume_before_the_deadline_wins_and_the_timeout_never_fires(
    env: Env, style: str
) -> None:
    env.agent.delay("t3", timeout=2, style=style)
    waiting = wait_until(
        lambda: (m := env.agent.thread("t3")).status == Status.WAITING and m,
        timeout=10,
        what="waiting",
    )
    assert waiting.interrupt == ASK and waiting.timeout == 2
    deadline = waiting.timeout_at
    assert deadline is not None and waiting.updated_at < deadline
    env.agent.resume("t3", {"approved": True})
    wait_until(lambda: env.agent.thread("t3").interrupt == THEN, timeout=10, what="next question")
    # A thread asked later than t3 with the same timeout: once it has timed out, the
    # sweeper has been past t3's deadline too.
    env.agent.delay("clock", timeout=2, style=style)
    assert finished(env, "clock").result["timed_out"] == ASK
    meta = env.agent.thread("t3")
    assert (meta.status, meta.interrupt, meta.timed_out) == (Status.WAITING, THEN, False)
    assert meta.timeout_at is None and "t3" not in [t for t, _ in env.store.due()]
    env.agent.resume("t3", "no, thanks")
    assert finished(env, "t3").result == {"answer": {"approved": True}, "then": "no, thanks"}


@pytest.mark.parametrize("style", ["call", "outcome"])
@pytest.mark.parametrize(
    ("timeout", "problem"),
    [
        (0, "must be positive"),
        (-1.5, "must be positive"),
        (float("inf"), "must be positive"),
        ("soon", "is not a duration"),
        (True, "is not a duration"),
    ],
)
def test_a_bad_timeout_fails_the_thread_saying_what_to_pass(
    env: Env, style: str, timeout: Any, problem: str
) -> None:
    env.agent.delay("t4", timeout=timeout, style=style)
    meta = finished(env, "t4")
    assert meta.status == Status.FAILED
    error = meta.error or ""
    assert error.startswith("InvalidArgument: thread 't4', step 1: timeout=")
    assert problem in error and "None to wait until resumed" in error


def test_a_timeout_that_passes_while_no_worker_runs_is_kept_by_the_store(
    redis_broker: str, redis_server: RedisServer, tmp_path: Path
) -> None:
    app, store = make("redis", redis_broker, redis_server, tmp_path)
    agent = app.tasks[DeadlineAgent.name]
    with worker(app):
        # Longer than the worker takes to stop: its own sweeper would send it.
        agent.delay("t5", timeout=4)
        wait_until(lambda: agent.thread("t5").status == Status.WAITING, timeout=10, what="wait")
    assert agent.thread("t5").timeout_at is not None
    # Every worker is gone when the timeout passes: the store still holds it as due.
    wait_until(lambda: "t5" in [t for t, _ in store.due()], timeout=20, what="t5 due")
    assert agent.thread("t5").status == Status.WAITING
    with worker(app):
        meta = wait_until(
            lambda: (m := agent.thread("t5")).status == Status.DONE and m, timeout=20, what="done"
        )
    assert meta.result == {"timed_out": ASK, "after": 4, "step": 1}
    store.close()
    app.close()
