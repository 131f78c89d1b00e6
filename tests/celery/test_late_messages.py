"""Messages that arrive after their thread is gone, and a node that asks twice, on an
in-process worker: neither may run a tool again or hand one question another's answer."""

from __future__ import annotations

import logging
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
from agentq.errors import ThreadStopped
from agentq.store.contract import Store
from tests.support.redis_server import RedisServer, wait_until


@dataclass
class Env:
    app: Celery
    agent: FunctionAgent
    store: Store
    refunds: list[str] = field(default_factory=list)


@pytest.fixture
def env(redis_broker: str, redis_server: RedisServer) -> Iterator[Env]:
    prefix = f"lm{uuid.uuid4().hex[:8]}:"
    app = Celery("agentq-late-messages", broker=redis_broker, set_as_current=False)
    app.conf.update(
        task_default_queue=f"agentq-test-{prefix}",
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    agentq.init_app(app, store=redis_server.url, prefix=prefix, lease_ttl=5, start_grace=5)
    agent = agentq.agent(app, "tests.late_messages")
    env = Env(app, agent, app._agentq_runtime.store)
    lock = threading.Lock()

    def refund(order: str) -> str:
        with lock:
            env.refunds.append(order)
        return f"refunded {order}"

    @agent.node
    def start(run: Run, order: str, questions: int = 0) -> Any:
        answers = [run.interrupt(f"question {n}") for n in range(questions)]
        return Done({"refund": run.tool(refund, order), "answers": answers})

    # One slot: messages run in the order they were sent.
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=30):
        yield env
    env.store.close()
    app.close()


def test_a_message_for_a_deleted_thread_does_not_start_it_again(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agentq")  # the test worker logs errors only
    env.agent.delay("t1", order="#1")
    assert env.agent.wait("t1", timeout=30) == {"refund": "refunded #1", "answers": []}
    meta = env.agent.thread("t1")
    assert env.store.delete_thread("t1")
    env.agent.resend(meta)  # a duplicate that the broker delivers after the deletion
    env.agent.delay("t2", order="#2")  # behind it in the queue
    assert env.agent.wait("t2", timeout=30)["refund"] == "refunded #2"
    assert env.store.meta("t1") is None
    assert env.refunds == ["#1", "#2"]
    # The same drop meets a caller that wrote the thread to another store than the
    # worker's: the warning names both causes.
    (dropped,) = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert "not in this worker's store" in dropped and "agentq_store" in dropped, dropped


def test_a_thread_sent_by_name_is_still_started(env: Env) -> None:
    env.app.send_task(env.agent.name, args=("t3",))
    wait_until(lambda: env.store.meta("t3") is not None, timeout=30, what="the thread opened")
    # Without its input the entry node cannot run, which is what the thread says.
    with pytest.raises(ThreadStopped, match="order"):
        env.agent.wait("t3", timeout=30)


def test_a_second_question_in_one_node_is_refused_not_given_the_first_answer(
    env: Env,
) -> None:
    env.agent.delay("t4", order="#4", questions=2)
    wait_until(lambda: env.agent.thread("t4").status == Status.WAITING, timeout=30, what="asked")
    assert env.agent.thread("t4").interrupt == "question 0"
    env.agent.resume("t4", "yes")
    with pytest.raises(ThreadStopped, match="a node asks one question") as stopped:
        env.agent.wait("t4", timeout=30)
    assert stopped.value.status == "failed" and env.refunds == []
    env.agent.delay("t5", order="#5", questions=1)
    wait_until(lambda: env.agent.thread("t5").status == Status.WAITING, timeout=30, what="asked")
    env.agent.resume("t5", "yes")
    assert env.agent.wait("t5", timeout=30) == {"refund": "refunded #5", "answers": ["yes"]}
