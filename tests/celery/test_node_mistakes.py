"""Mistakes a node can make with its run, on an in-process worker (Redis broker and result
backend, private Redis store): each fails the thread with an agentq error naming the
thread, the step and the fix, the task ends ``FAILURE`` with that error, and the step
before it stays the latest checkpoint, from which the thread runs on once fixed."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

import agentq
from agentq import AgentTask, Done, Run, Status
from agentq.errors import InvalidArgument, ThreadStopped, UnserializableState
from tests.support.redis_server import RedisServer

FIXED: set[str] = set()
"""Threads whose mistake was fixed: their next run of ``act`` finishes."""
KEPT: dict[str, Run] = {}
"""Runs a node kept beyond its return, by thread."""
CHARGED: list[str] = []
"""The threads whose charge tool ran."""
_charged = threading.Lock()


def charge(thread_id: str) -> str:
    with _charged:
        CHARGED.append(thread_id)
    return "charged"


def _get_by_digest(run: Run) -> None:
    run.artifacts.get(run.artifacts.put(b"%PDF")["artifact"])  # type: ignore[arg-type]


def _set(field: str, value: Any) -> Callable[[Run], None]:
    return lambda run: setattr(run, field, value)


MISTAKES: dict[str, Callable[[Run], Any]] = {
    "state=None": _set("state", None),
    "state=list": _set("state", ["a"]),
    "pending=dict": _set("pending", {"id": "call-2"}),
    "cursors=list": _set("cursors", [1]),
    "tool=None": lambda run: run.tool(None, key="call-1"),
    "tool=name": lambda run: run.tool("charge", run.thread_id, key="call-1"),
    "artifact=str": lambda run: run.artifacts.put("a report"),
    "artifact=None": lambda run: run.artifacts.put(None),
    "get=digest": _get_by_digest,
    "question=lock": lambda run: run.interrupt({"approve": threading.Lock()}),
    "TypeError": lambda run: len(None),  # type: ignore[arg-type]
    "kept run: tool": lambda run: KEPT[run.thread_id].tool(charge, run.thread_id, key="late"),
    "kept run: artifacts.put": lambda run: KEPT[run.thread_id].artifacts.put(b"%PDF"),
    "kept run: interrupt": lambda run: KEPT[run.thread_id].interrupt({"question": "ok?"}),
}
"""What ``act`` does wrong, by the name a test sends it with."""


class MistakesAgent(AgentTask):  # type: ignore[misc]
    name = "tests.node_mistakes_agent"

    def start(self, run: Run, mistake: str, node: str = "act") -> str:
        run.state["mistake"] = mistake
        run.pending = [{"id": "call-1"}]
        run.cursors["page"] = 1
        KEPT[run.thread_id] = run
        return node

    def act(self, run: Run) -> Any:
        if run.thread_id in FIXED:
            return Done("fixed")
        MISTAKES[run.state["mistake"]](run)
        return Done("not refused")

    def forgot_the_run(self) -> Done:
        return Done("not refused")

    async def forgot_await(self, run: Run) -> Any:
        return self.aact(run)

    async def aact(self, run: Run) -> Any:
        if run.thread_id in FIXED:
            return Done("fixed")
        await run.atool(None, key="call-1")  # type: ignore[call-overload]
        return Done("not refused")


class CommaAgent(AgentTask):  # type: ignore[misc]
    """Declares its append-only field without the tuple's comma."""

    name = "tests.comma_agent"
    append_only = "messages"  # type: ignore[assignment]

    def start(self, run: Run) -> Done:
        run.state["messages"] = ["hi"]
        return Done("not refused")


@pytest.fixture
def app(redis_broker: str, result_backend: str, redis_server: RedisServer) -> Iterator[Celery]:
    prefix = f"nm{uuid.uuid4().hex[:8]}:"
    app = Celery("agentq-node-mistakes", broker=redis_broker, set_as_current=False)
    app.conf.update(
        task_default_queue=f"agentq-test-{prefix}",
        result_backend=result_backend,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    agentq.init_app(app, store=redis_server.url, prefix=prefix, lease_ttl=3, sweep_interval=0.2)
    app.register_task(MistakesAgent())
    app.register_task(CommaAgent())
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
        yield app
    app._agentq_runtime.store.close()
    app.close()


# Celery's Redis result backend still calls redis-py's deprecated setex.
pytestmark = pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")


@pytest.mark.parametrize(
    ("mistake", "node", "error", "fix"),
    [
        ("state=None", "act", UnserializableState, "run.state was set to NoneType"),
        ("state=list", "act", UnserializableState, "run.state was set to list"),
        ("pending=dict", "act", UnserializableState, "run.pending = [] when none is"),
        ("cursors=list", "act", UnserializableState, "run.cursors['name'] = position"),
        ("tool=None", "act", InvalidArgument, "run.tool() was given NoneType None"),
        ("tool=name", "act", InvalidArgument, "str 'charge', not a function to call"),
        ("tool=None", "aact", InvalidArgument, "run.atool() was given NoneType None"),
        ("artifact=str", "act", InvalidArgument, "pass data.encode()"),
        ("artifact=None", "act", InvalidArgument, "stores bytes, not NoneType"),
        ("get=digest", "act", InvalidArgument, "the reference run.artifacts.put() returned"),
        ("question=lock", "act", UnserializableState, "interrupt.approve: lock cannot be"),
    ],
)
def test_a_mistake_fails_the_step_and_the_thread_runs_on_from_the_step_before(
    app: Celery, mistake: str, node: str, error: type[Exception], fix: str
) -> None:
    agent: Any = app.tasks["tests.node_mistakes_agent"]
    store = app._agentq_runtime.store
    thread_id = f"t-{uuid.uuid4().hex[:8]}"
    result = agent.delay(thread_id, mistake=mistake, node=node)
    with pytest.raises(error) as raised:
        result.get(timeout=20)
    message = str(raised.value)
    assert message.startswith(f"thread {thread_id!r}, step 1: "), message
    assert fix in message
    assert result.state == "FAILURE"
    meta = agent.thread(thread_id)
    assert (meta.status, meta.step) == (Status.FAILED, 0)
    latest = store.latest(thread_id)
    assert latest is not None and latest.step == 0
    assert (latest.node, latest.pending, latest.cursors) == (node, [{"id": "call-1"}], {"page": 1})
    assert store.effect(thread_id, "call-1") is None  # no tool call was claimed
    FIXED.add(thread_id)
    agent.retry_thread(thread_id)
    assert agent.wait(thread_id, timeout=20) == "fixed"


def test_a_node_that_cannot_take_its_run_or_input_says_so(app: Celery) -> None:
    """Python's TypeError would name no thread, step or fix; one the node's body raises
    stays the node's own."""
    agent: Any = app.tasks["tests.node_mistakes_agent"]
    agent.delay("t1", mistake="none", node="forgot_the_run")
    agent.delay("t2")  # a new thread sent without its input: not checked by delay()
    agent.delay("t3", mistake="TypeError")
    errors = {}
    for thread_id in ("t1", "t2", "t3"):
        with pytest.raises(ThreadStopped) as stopped:
            agent.wait(thread_id, timeout=20)
        errors[thread_id] = stopped.value.error or ""
    assert errors["t1"].startswith(
        "InvalidInput: thread 't1', step 1: node forgot_the_run() cannot be called with its "
        "run (too many positional arguments); a node takes its run as its first argument"
    ), errors["t1"]
    assert errors["t2"].startswith(
        "InvalidInput: thread 't2', step 0: node start(run: 'Run', mistake: 'str', node: "
        "'str' = 'act') cannot be called with its run (missing a required argument: "
        "'mistake')"
    ), errors["t2"]
    assert errors["t3"].startswith("TypeError: object of type 'NoneType' has no len()")
    assert agent.thread("t1").step == 0 and agent.thread("t2").step == -1


def test_an_async_node_that_returns_what_it_did_not_await_says_so(app: Celery) -> None:
    agent: Any = app.tasks["tests.node_mistakes_agent"]
    agent.delay("t1", mistake="none", node="forgot_await")
    with pytest.raises(ThreadStopped) as stopped:
        agent.wait("t1", timeout=20)
    error = stopped.value.error or ""
    assert error.startswith(
        "UnknownNode: thread 't1', step 1: node 'forgot_await' returned a coroutine it did "
        "not await; await it (return await ...)"
    ), error
    assert agent.thread("t1").step == 0


@pytest.mark.parametrize("call", ["tool", "artifacts.put", "interrupt"])
def test_a_run_kept_beyond_its_node_refuses_what_would_belong_to_no_step(
    app: Celery, call: str
) -> None:
    """Its step is committed without it: a tool call claimed under it would be in no
    step, under a key a later call of that step's numbering could meet."""
    agent: Any = app.tasks["tests.node_mistakes_agent"]
    store = app._agentq_runtime.store
    thread_id = f"t-{uuid.uuid4().hex[:8]}"
    agent.delay(thread_id, mistake=f"kept run: {call}")
    with pytest.raises(ThreadStopped) as stopped:
        agent.wait(thread_id, timeout=20)
    error = stopped.value.error or ""
    assert error.startswith(f"InvalidArgument: thread {thread_id!r}, step 0: "), error
    assert f"run.{call}() was called after node 'start' returned" in error
    assert thread_id not in CHARGED and store.effect(thread_id, "late") is None
    assert (agent.thread(thread_id).step, store.latest(thread_id).step) == (0, 0)


def test_an_append_only_declaration_without_its_comma_says_so(app: Celery) -> None:
    """``("messages")`` is a string, whose letters would each be taken for a field."""
    agent: Any = app.tasks["tests.comma_agent"]
    agent.delay("t1")
    with pytest.raises(ThreadStopped) as stopped:
        agent.wait("t1", timeout=20)
    error = stopped.value.error or ""
    assert error.startswith("InvalidArgument: thread 't1': append_only is 'messages'"), error
    assert "('messages',)" in error
    assert app._agentq_runtime.store.latest("t1") is None
