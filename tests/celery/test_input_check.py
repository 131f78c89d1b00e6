"""``delay`` checks the input against the entry node's signature in the caller, as
Celery's ``typing`` option does for a plain task: nothing is stored or sent on a typo."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

import agentq
from agentq.errors import InvalidInput
from tests.support.agents import make_app
from tests.support.redis_server import RedisServer


@pytest.fixture
def app(redis_broker: str, redis_server: RedisServer) -> Iterator[Celery]:
    prefix = f"in{uuid.uuid4().hex[:8]}:"
    app = make_app(
        broker=redis_broker,
        store=redis_server.url,
        prefix=prefix,
        queue=f"agentq-test-{prefix}",
        ledger_url=redis_server.url,
    )
    yield app
    app._agentq_runtime.store.close()
    app.close()


def _queued(app: Celery, broker: str) -> int:
    with contextlib.closing(redis.Redis.from_url(broker)) as client:
        return int(client.llen(app.conf.task_default_queue))


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"n": 3, "slwo": 1.0}, "unexpected keyword argument(s) ['slwo']"),
        ({"slow": 1.0}, "missing a required argument: 'n'"),
    ],
)
def test_input_that_does_not_fit_the_start_node_fails_in_the_caller(
    app: Celery, redis_broker: str, kwargs: dict[str, Any], problem: str
) -> None:
    agent = app.tasks["tests.counting_agent"]
    with pytest.raises(InvalidInput) as raised:
        agent.delay("t1", **kwargs)
    message = str(raised.value)
    assert "'t1'" in message and "tests.counting_agent.start(run" in message
    assert problem in message
    assert raised.value.thread_id == "t1"
    assert app._agentq_runtime.store.meta("t1") is None
    assert _queued(app, redis_broker) == 0


def test_input_is_checked_against_a_function_agents_entry_node(app: Celery) -> None:
    notes = agentq.agent(app, f"tests.fn_{uuid.uuid4().hex[:6]}", entry_node="begin")

    @notes.node
    def begin(run: agentq.Run, first: str) -> str:
        return "begin"

    with pytest.raises(InvalidInput, match="begin"):
        notes.delay("t2", frist="a")
    notes.delay("t2", first="a")
    assert app._agentq_runtime.store.meta("t2") is not None


def test_a_node_added_after_the_first_delay_checks_the_next_one(app: Celery) -> None:
    """A function agent may be sent to before the module defining its nodes is imported:
    that first send is not checked, the ones after the node exists are."""
    late = agentq.agent(app, f"tests.fn_{uuid.uuid4().hex[:6]}")
    late.delay("t3", question="hi")

    @late.node
    def start(run: agentq.Run, question: str) -> str:
        return "start"

    with pytest.raises(InvalidInput, match="questoin"):
        late.delay("t4", questoin="typo")
    assert app._agentq_runtime.store.meta("t4") is None


def test_a_redefined_entry_node_is_checked_by_its_new_signature(app: Celery) -> None:
    """A node defined again (a notebook, a reload) is checked by the new definition."""
    changing = agentq.agent(app, f"tests.fn_{uuid.uuid4().hex[:6]}")

    def asks(run: agentq.Run, question: str) -> str:
        return "start"

    def tells(run: agentq.Run, topic: str) -> str:
        return "start"

    asks.__name__ = tells.__name__ = "start"
    changing.node(asks)
    changing.delay("t5", question="hi")
    changing.node(tells)
    changing.delay("t6", topic="a")
    assert app._agentq_runtime.store.meta("t6") is not None
    with pytest.raises(InvalidInput, match="question"):
        changing.delay("t7", question="hi")
