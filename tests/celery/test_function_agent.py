"""The function form (``agentq.agent`` and ``@agent.node``) on an in-process Celery worker:
the same driver as the class form, so these tests check the wiring, not the guarantees
again."""

from __future__ import annotations

import collections
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

import agentq
from agentq import Done, FunctionAgent, Run, Status
from agentq.errors import InvalidArgument
from tests.support.agents import RateLimitError
from tests.support.redis_server import RedisServer


@dataclass
class Calls:
    """What the nodes and the tool did, counted in this process (the worker is in-process)."""

    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, what: str) -> int:
        with self.lock:
            self.counts[what] += 1
            return self.counts[what]


@dataclass
class Env:
    app: Celery
    support: FunctionAgent
    planner: FunctionAgent
    calls: Calls


def define_agents(app: Celery, calls: Calls) -> tuple[FunctionAgent, FunctionAgent]:
    support = agentq.agent(
        app, "tests.fn_support", retry_on=(RateLimitError,), append_only=("messages",)
    )

    def refund(amount: int, *, idempotency_key: str) -> str:
        calls(f"refund {idempotency_key}")
        return f"refunded {amount}"

    @support.node
    def start(run: Run, question: str) -> str:
        calls("start")
        run.state["messages"] = [{"role": "user", "content": question}]
        return "model"

    @support.node
    def model(run: Run) -> Any:
        if calls("model") == 1:
            raise RateLimitError(retry_after="0")
        if run.state["messages"][-1]["role"] == "tool":
            return Done(run.state["messages"][-1]["content"])
        run.pending = [{"id": "call-1", "amount": 20}]
        return "tools"

    @support.node
    async def tools(run: Run) -> str:  # nodes may be coroutines, as in the class form
        for call in run.pending:
            result = await run.atool(refund, call["amount"], key=call["id"], idempotent=True)
            run.state["messages"].append({"role": "tool", "content": result})
        run.pending = []
        return "model"

    planner = agentq.agent(app, "tests.fn_planner", entry_node="plan")

    @planner.node
    def plan(run: Run, goal: str) -> Done:
        return Done(f"plan for {goal}")

    return support, planner


@pytest.fixture
def env(redis_broker: str, redis_server: RedisServer) -> Iterator[Env]:
    prefix = f"fn{uuid.uuid4().hex[:8]}:"
    app = Celery("agentq-fn-tests", broker=redis_broker, set_as_current=False)
    app.conf.update(
        task_default_queue=f"agentq-test-{prefix}",
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    agentq.init_app(
        app,
        store=redis_server.url,
        prefix=prefix,
        lease_ttl=3,
        sweep_interval=0.2,
        start_grace=5,
        backoff_base=0.1,
    )
    calls = Calls()
    support, planner = define_agents(app, calls)
    with start_worker(
        app, pool="threads", concurrency=2, perform_ping_check=False, shutdown_timeout=30
    ):
        yield Env(app, support, planner, calls)
    app._agentq_runtime.store.close()
    app.close()


def test_function_nodes_run_a_durable_thread(env: Env) -> None:
    env.support.delay("t1", question="refund my order")
    assert env.support.wait("t1", timeout=30) == "refunded 20"
    meta = env.support.thread("t1")
    # start, model (429, retried from the checkpoint), model, tools, model
    assert (meta.status, meta.step) == (Status.DONE, 3)
    refund = f"refund {env.app._agentq_runtime.store.downstream_key('t1', 'call-1')}"
    assert env.calls.counts == {"start": 1, "model": 3, refund: 1}
    env.support.delay("t1")  # sent again once done: returns the result, runs nothing
    assert env.support.wait("t1", timeout=5) == "refunded 20"
    assert env.calls.counts == {"start": 1, "model": 3, refund: 1}


def test_options_are_task_attributes_and_the_entry_node_is_configurable(env: Env) -> None:
    assert env.app.tasks["tests.fn_support"] is env.support
    assert isinstance(env.support, agentq.AgentTask)
    assert env.support.retry_on == (RateLimitError,)
    assert env.support.append_only == ("messages",)
    env.planner.delay("t2", goal="launch")
    assert env.planner.wait("t2", timeout=30) == "plan for launch"


def test_a_node_cannot_hide_a_task_attribute(env: Env) -> None:
    def run(run: Run) -> str:
        return "model"

    def delay(run: Run) -> str:
        return "model"

    for fn in (run, delay):
        with pytest.raises(InvalidArgument, match=f"cannot be named '{fn.__name__}'"):
            env.planner.node(fn)
    with pytest.raises(InvalidArgument, match="public name"):
        env.planner.node(lambda run: "plan")
    assert "run" not in vars(type(env.planner)) and "delay" not in vars(type(env.planner))
    env.planner.delay("t3", goal="ship")
    assert env.planner.wait("t3", timeout=30) == "plan for ship"


def test_an_agent_needs_a_name() -> None:
    app = Celery("agentq-fn-names", set_as_current=False)
    with pytest.raises(InvalidArgument, match="needs a task name"):
        agentq.agent(app, "")


def test_a_node_that_takes_no_run_or_yields_is_refused_where_it_is_defined() -> None:
    """Added, it would fail every thread that reaches it with Python's TypeError (naming
    no thread nor step) or return a generator, not a next node."""
    app = Celery("agentq-fn-signatures", set_as_current=False)
    notes = agentq.agent(app, "tests.fn_signatures")

    def model() -> str:
        return "model"

    def tools(*, run: Run) -> str:
        return "model"

    def stream(run: Run) -> Iterator[str]:
        yield "model"

    for fn, problem in ((model, r"model\(\) takes no run"), (tools, r"tools\(\*, run")):
        with pytest.raises(InvalidArgument, match=problem) as raised:
            notes.node(fn)
        assert f"def {fn.__name__}(run, ...)" in str(raised.value)
    with pytest.raises(InvalidArgument, match="node stream is a generator"):
        notes.node(stream)
    assert not {"model", "tools", "stream"} & set(vars(type(notes)))


def test_append_only_given_as_one_string_is_refused_where_the_agent_is_made() -> None:
    app = Celery("agentq-fn-append-only", set_as_current=False)
    with pytest.raises(InvalidArgument, match=r"append_only=\('messages',\)"):
        agentq.agent(app, "tests.fn_comma", append_only=("messages"))
    assert "tests.fn_comma" not in app.tasks
