"""What names the next node: a node name given as an enum member, and names that are no
node of the agent, on an in-process worker (Redis broker, private Redis store)."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from agentq import AgentTask, Done, Interrupt, Run, Status
from agentq.errors import ThreadStopped
from tests.support.agents import make_app
from tests.support.redis_server import RedisServer, wait_until


class Node(str, enum.Enum):  # noqa: UP042  # the mixin users write, whose str() differs
    """Node names as a (str, Enum): ``str()`` of a member is ``"Node.FINISH"``."""

    ASK = "ask"
    FINISH = "finish"


class EnumNodesAgent(AgentTask):  # type: ignore[misc]
    name = "tests.enum_nodes_agent"

    def start(self, run: Run) -> str:
        run.state["asked"] = False
        return Node.ASK

    def ask(self, run: Run) -> Interrupt:
        run.state["asked"] = True
        return Interrupt({"question": "ok?"}, resume_at=Node.FINISH)

    def finish(self, run: Run) -> Done:
        return Done({"asked": run.state["asked"], "answer": run.resume_value})


class TaskMethodNodeAgent(AgentTask):  # type: ignore[misc]
    """Names a next node it does not define, that is the name of a task method."""

    name = "tests.task_method_node_agent"

    def start(self, run: Run, next_node: str) -> str:
        return next_node


class BadInterruptAgent(AgentTask):  # type: ignore[misc]
    """Asks a person, naming no node (or not by name) to continue at."""

    name = "tests.bad_interrupt_agent"

    def start(self, run: Run, resume_at: Any) -> str:
        run.state["at"] = resume_at
        return "ask"

    def ask(self, run: Run) -> Interrupt:
        return Interrupt({"question": "ok?"}, resume_at=run.state.get("at"))


@pytest.fixture
def app(redis_broker: str, redis_server: RedisServer) -> Iterator[Celery]:
    prefix = f"nn{uuid.uuid4().hex[:8]}:"
    app = make_app(
        broker=redis_broker,
        store=redis_server.url,
        prefix=prefix,
        queue=f"agentq-test-{prefix}",
        ledger_url=redis_server.url,
    )
    app.register_task(EnumNodesAgent())
    app.register_task(TaskMethodNodeAgent())
    app.register_task(BadInterruptAgent())
    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False):
        yield app
    app._agentq_runtime.store.close()
    app.close()


def test_a_node_named_by_an_enum_member_is_where_the_thread_resumes(app: Celery) -> None:
    agent: Any = app.tasks["tests.enum_nodes_agent"]
    agent.delay("t1")
    wait_until(lambda: agent.thread("t1").status == Status.WAITING, timeout=20, what="waiting")
    meta = agent.thread("t1")
    assert type(meta.node) is str and meta.node == "finish"
    latest = app._agentq_runtime.store.latest("t1")
    assert latest is not None and type(latest.node) is str and latest.node == "finish"
    agent.resume("t1", "yes")
    assert agent.wait("t1", timeout=20) == {"asked": True, "answer": "yes"}


@pytest.mark.parametrize("name", ["wait", "delay", "run", "resume", "apply"])
def test_a_task_method_the_agent_does_not_define_is_an_unknown_node(app: Celery, name: str) -> None:
    """Calling ``wait(run)`` or ``delay(run)`` would fail far from the cause, with an
    error about a thread id, or call Celery with a Run as its arguments."""
    agent: Any = app.tasks["tests.task_method_node_agent"]
    agent.delay("t1", next_node=name)
    with pytest.raises(ThreadStopped) as info:
        agent.wait("t1", timeout=20)
    error = info.value.error or ""
    assert error.startswith("UnknownNode: thread 't1', step 1: node"), error
    assert f"{name!r} is not a node of TaskMethodNodeAgent" in error
    assert agent.thread("t1").step == 0  # the step that named it is kept


@pytest.mark.parametrize("resume_at", [None, 3])
def test_an_interrupt_that_names_no_node_fails_before_it_waits(app: Celery, resume_at: Any) -> None:
    """Stored, the wait would end at a resume that finds no node to continue at."""
    agent: Any = app.tasks["tests.bad_interrupt_agent"]
    agent.delay("t1", resume_at=resume_at)
    with pytest.raises(ThreadStopped) as info:
        agent.wait("t1", timeout=20)
    error = info.value.error or ""
    assert error.startswith("UnknownNode: thread 't1', step 1: node 'ask'"), error
    assert "resume_at" in error
    assert agent.thread("t1").step == 0  # nothing of the failed step is kept
