"""A real StateGraph run as a graph task on an in-process worker (Redis broker), on each
agentq store: to the end, through an interrupt, a rate limit and an unknown tool outcome,
with the same final state as LangGraph's own MemorySaver gives."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from click.testing import CliRunner, Result
from langchain_core.messages import ToolMessage
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.memory import InMemorySaver

from agentq import Status
from agentq.cli import cli
from agentq.errors import InvalidArgument, InvalidThreadId, ThreadStopped
from agentq.langgraph import AgentqSaver, GraphTask
from agentq.langgraph.task import has_async_nodes
from agentq.store.contract import Store
from tests.support.agents import Ledger
from tests.support.graphs import (
    ASYNC_GRAPH_TASK,
    GRAPH_TASK,
    TYPED_GRAPH_TASK,
    Order,
    Refund,
    build_graph,
    build_typed_graph,
    make_graph_app,
    question,
)
from tests.support.redis_server import RedisServer, wait_until


class Env:
    def __init__(self, app: Celery, ledger: Ledger) -> None:
        self.app = app
        self.ledger = ledger
        self.store: Store = app._agentq_runtime.store
        self.task: GraphTask = app.tasks[GRAPH_TASK]


@pytest.fixture
def env(
    backend: str, redis_broker: str, redis_server: RedisServer, tmp_path: Path
) -> Iterator[Env]:
    prefix = f"gt{uuid.uuid4().hex[:8]}:"
    store = redis_server.url if backend == "redis" else f"sqlite:///{tmp_path / 'agentq.db'}"
    app = make_graph_app(
        broker=redis_broker,
        store=store,
        prefix=prefix,
        queue=f"agentq-test-{prefix}",
        ledger_url=redis_server.url,
        lease_ttl=3,
        sweep_interval=0.2,
        start_grace=5,
        backoff_base=0.1,
    )
    with start_worker(
        app, pool="threads", concurrency=2, perform_ping_check=False, shutdown_timeout=30
    ):
        yield Env(app, Ledger(redis_server.url, prefix.rstrip(":"), app._agentq_runtime.store))
    app._agentq_runtime.store.close()


def final_text(result: Any) -> str:
    return str(result["messages"][-1]["content"])


def test_a_graph_runs_to_done_with_a_checkpoint_per_step(env: Env) -> None:
    env.task.delay("t1", question("refund my order", refunds=2))
    result = env.task.wait("t1", timeout=30)
    assert final_text(result) == "Refunded 20 EUR."
    assert [m["type"] for m in result["messages"]] == ["human", "ai", "tool", "ai", "tool", "ai"]
    assert env.ledger.model_calls("t1") == 3
    assert env.ledger.tool_calls("t1") == env.ledger.as_sent(
        "t1", {"call-refund-1": 1, "call-refund-2": 1}
    )
    effect = env.store.effect("t1", "call-refund-2")
    assert effect is not None and effect.state == "done"
    # input, then model/tools/model/tools/model: one LangGraph checkpoint per super-step
    history = list(env.task.saver.list({"configurable": {"thread_id": "t1"}}))
    assert [t.metadata["step"] for t in history] == [5, 4, 3, 2, 1, 0, -1]
    assert env.task.state("t1").next == ()


def test_the_same_graph_ends_in_the_same_state_as_with_memory_saver(env: Env) -> None:
    env.task.delay("t1", question("refund twice", refunds=2))
    env.task.wait("t1", timeout=30)
    by_task = env.task.state("t1").values
    plain = build_graph(env.ledger)
    memory = plain.compile(checkpointer=InMemorySaver())
    by_memory = memory.invoke(
        question("refund twice", refunds=2), {"configurable": {"thread_id": "m1"}}
    )
    saver = AgentqSaver(env.store)
    by_saver = plain.compile(checkpointer=saver).invoke(
        question("refund twice", refunds=2), {"configurable": {"thread_id": "s1"}}
    )
    assert by_memory == by_saver
    # Under a task the tool received the key agentq forwards downstream; outside one, the
    # model's tool-call id.
    for message in by_task["messages"]:
        if isinstance(message, ToolMessage):
            sent = env.store.downstream_key("t1", message.tool_call_id)
            message.content = message.content.replace(sent, message.tool_call_id)
    assert by_task == by_memory
    replayed = saver.get_tuple({"configurable": {"thread_id": "s1"}})
    assert (
        replayed is not None
        and replayed.checkpoint["channel_values"]["messages"] == (by_memory["messages"])
    )


def test_interrupt_waits_and_resume_sends_the_value(env: Env) -> None:
    env.task.delay("t1", question("refund?", approval=True))
    wait_until(lambda: env.task.thread("t1").status == Status.WAITING, timeout=20, what="waiting")
    meta = env.task.thread("t1")
    [pending] = meta.interrupt
    assert pending["value"] == {"question": "refund 10 EUR?"}
    assert pending["id"] == env.task.state("t1").interrupts[0].id
    assert env.ledger.tool_calls("t1") == {}
    with pytest.raises(ThreadStopped) as info:
        env.task.wait("t1", timeout=1)
    assert info.value.status == "waiting"
    env.task.resume("t1", {"approved": True})
    assert final_text(env.task.wait("t1", timeout=30)) == "Refunded 10 EUR."
    assert env.task.state("t1").values["approved"] is True
    assert env.ledger.tool_calls("t1") == env.ledger.as_sent("t1", {"call-refund-1": 1})
    assert env.ledger.model_calls("t1") == 2  # the interrupt re-ran no model call


@pytest.mark.parametrize("value", ['{"approved": true}', '{"approved": false}'])
def test_resume_from_the_cli_sends_its_json_value(env: Env, value: str) -> None:
    """``agentq resume --value`` stores the JSON value as it is, not packed as
    :meth:`GraphTask.resume` packs it: the graph gets it all the same."""
    env.task.delay("t1", question("refund?", approval=True))
    wait_until(lambda: env.task.thread("t1").status == Status.WAITING, timeout=20, what="waiting")
    settings = env.app._agentq_runtime.settings
    resumed = CliRunner().invoke(
        cli,
        ["--store", settings.store, "--prefix", settings.prefix, "resume", "t1", "--value", value],
        catch_exceptions=False,
    )
    assert resumed.exit_code == 0, resumed.output
    env.task.wait("t1", timeout=30)
    approved = env.task.state("t1").values["approved"]
    assert approved is json.loads(value)["approved"]
    refunds = {"call-refund-1": 1} if approved else {}
    assert env.ledger.tool_calls("t1") == env.ledger.as_sent("t1", refunds)


def test_a_refusal_through_resume_skips_the_refund(env: Env) -> None:
    env.task.delay("t1", question("refund?", approval=True))
    wait_until(lambda: env.task.thread("t1").status == Status.WAITING, timeout=20, what="waiting")
    env.task.resume("t1", {"approved": False})
    env.task.wait("t1", timeout=30)
    assert env.ledger.tool_calls("t1") == {}


def cli_on(env: Env, *args: str) -> Result:
    """The ``agentq`` command against the env's store (its workers' sweepers send what
    it queues)."""
    settings = env.app._agentq_runtime.settings
    return CliRunner().invoke(cli, ["--store", settings.store, "--prefix", settings.prefix, *args])


def graph_data(env: Env, thread_id: str) -> list[CheckpointTuple]:
    """Every LangGraph checkpoint the store holds for the thread."""
    return list(env.task.saver.list({"configurable": {"thread_id": thread_id}}))


def stood(checkpoint: CheckpointTuple) -> tuple[Any, ...]:
    """Where a LangGraph checkpoint stands, whichever thread holds it."""
    configurable = checkpoint.config["configurable"]
    return (
        configurable["checkpoint_ns"],
        configurable["checkpoint_id"],
        checkpoint.checkpoint,
        checkpoint.pending_writes,
    )


def test_a_fork_of_a_waiting_graph_thread_resumes_where_the_source_waits(env: Env) -> None:
    env.task.delay("t1", question("refund?", approval=True))
    wait_until(lambda: env.task.thread("t1").status == Status.WAITING, timeout=20, what="waiting")
    source = env.task.thread("t1")
    before = graph_data(env, "t1")
    forked = cli_on(env, "fork", "t1", "--from", str(source.step), "--to", "f1")
    assert forked.exit_code == 0, forked.output
    assert [stood(t) for t in graph_data(env, "f1")] == [stood(t) for t in before]
    assert env.task.state("f1").interrupts == env.task.state("t1").interrupts
    resumed = cli_on(env, "resume", "f1", "--value", '{"approved": false}')
    assert resumed.exit_code == 0, resumed.output
    env.task.wait("f1", timeout=30)
    assert env.task.state("f1").values["approved"] is False
    assert env.ledger.tool_calls("f1") == {}
    # The source still waits on its own checkpoints, and takes its own answer.
    assert env.task.thread("t1").status == Status.WAITING
    assert graph_data(env, "t1") == before
    env.task.resume("t1", {"approved": True})
    assert final_text(env.task.wait("t1", timeout=30)) == "Refunded 10 EUR."
    assert env.ledger.tool_calls("t1") == env.ledger.as_sent("t1", {"call-refund-1": 1})
    # Deleting the fork takes its LangGraph data with it.
    assert env.store.delete_thread("f1")
    assert graph_data(env, "f1") == []
    assert graph_data(env, "t1") != []


def test_a_fork_of_a_graph_step_its_checkpoints_moved_past_is_refused(env: Env) -> None:
    env.task.delay("t1", question("refund?", approval=True))
    wait_until(lambda: env.task.thread("t1").status == Status.WAITING, timeout=20, what="waiting")
    waited_at = env.task.thread("t1").step
    env.task.resume("t1", {"approved": True})
    env.task.wait("t1", timeout=30)
    forked = cli_on(env, "fork", "t1", "--from", str(waited_at), "--to", "f1")
    assert forked.exit_code != 0
    message = " ".join(forked.output.split())
    assert f"thread 't1', step {waited_at}: cannot fork this LangGraph thread" in message
    assert "update_state" in message and "checkpoint_id" in message
    assert env.store.meta("f1") is None
    assert graph_data(env, "f1") == []


def test_a_rate_limit_retries_the_step_from_the_checkpoint(env: Env) -> None:
    env.task.delay("t1", question("hi", rate_limits=1, retry_after=1))
    wait_until(lambda: env.task.thread("t1").status == Status.RETRYING, timeout=20, what="retrying")
    assert env.task.thread("t1").attempts == 1
    assert final_text(env.task.wait("t1", timeout=30)) == "Refunded 10 EUR."
    assert env.ledger.model_calls("t1") == 3  # one refused, then the two of the run
    assert env.ledger.tool_calls("t1") == env.ledger.as_sent("t1", {"call-refund-1": 1})


def test_sending_a_thread_again_never_runs_it_twice(env: Env) -> None:
    env.task.delay("t1", question("refund"))
    env.task.wait("t1", timeout=30)
    env.task.delay("t1", question("refund again", refunds=5))
    assert final_text(env.task.wait("t1", timeout=5)) == "Refunded 10 EUR."
    assert env.ledger.model_calls("t1") == 2


def _claim_as_dead_worker(env: Env, policy: str) -> None:
    """Start the thread as a worker that claimed the refund and died before recording it."""
    packed = env.task._pack(question("refund", policy=policy))
    env.store.open_thread("t1", task=GRAPH_TASK, start_grace=3600, input={"input": packed})
    token = env.store.acquire("t1", "dead-worker", 30)
    env.store.claim_effect("t1", "call-refund-1", token)
    env.store.set_status("t1", token, Status.QUEUED, due_in=0, release_owner="dead-worker")


def test_an_unknown_tool_outcome_is_settled_by_reconcile(env: Env) -> None:
    _claim_as_dead_worker(env, "reconcile")
    env.ledger.client.hset(
        env.ledger.key("effects", "t1"), env.ledger.sent("t1", "call-refund-1"), 10
    )
    env.task.enqueue("t1")
    assert final_text(env.task.wait("t1", timeout=30)) == "Refunded 10 EUR."
    assert env.ledger.tool_calls("t1") == {}  # reconciled, not run again


def test_an_unknown_tool_outcome_without_policy_needs_attention(env: Env) -> None:
    _claim_as_dead_worker(env, "none")
    env.task.enqueue("t1")
    with pytest.raises(ThreadStopped) as info:
        env.task.wait("t1", timeout=30)
    assert info.value.status == "needs_attention"
    assert "call-refund-1" in (info.value.error or "")
    assert env.ledger.tool_calls("t1") == {}


def test_delay_takes_the_thread_id_and_the_input(env: Env) -> None:
    with pytest.raises(InvalidArgument, match="delay\\(thread_id, input\\)"):
        env.task.delay("t1", question("a"), question("b"))
    with pytest.raises(InvalidThreadId):
        env.task.delay("bad{id}", question("a"))


def test_cancel_stops_the_graph_between_two_steps(env: Env) -> None:
    env.task.delay("t1", question("refund a lot", refunds=20, slow=0.3))
    wait_until(lambda: env.ledger.model_calls("t1") >= 2, timeout=20, what="two model calls")
    assert env.task.cancel("t1") == Status.RUNNING
    wait_until(
        lambda: env.task.thread("t1").status == Status.CANCELLED, timeout=20, what="cancelled"
    )
    calls = env.ledger.model_calls("t1")
    assert calls < 21
    # the graph stopped at a super-step boundary, with its checkpoints intact
    assert env.task.state("t1").next in (("model",), ("tools",))


def test_a_subclass_may_give_its_graph_as_a_plain_factory(env: Env) -> None:
    ledger = env.ledger

    class Subclassed(GraphTask):
        name = "tests.subclassed_graph"
        graph = lambda: build_graph(ledger)  # noqa: E731

    task = env.app.register_task(Subclassed())
    assert task.compiled().checkpointer is task.saver


def test_a_graph_of_async_nodes_runs_with_astream(env: Env) -> None:
    task: GraphTask = env.app.tasks[ASYNC_GRAPH_TASK]
    assert has_async_nodes(task.compiled()) and not has_async_nodes(env.task.compiled())
    task.delay("a1", {"n": 4})
    assert task.wait("a1", timeout=30) == {"n": 9}
    assert env.ledger.tool_calls("a1") == {"lookup": 1}
    assert task.state("a1").values == {"n": 9}


def test_the_states_models_and_dataclasses_come_back_as_themselves(env: Env) -> None:
    task: GraphTask = env.app.tasks[TYPED_GRAPH_TASK]
    task.delay("o1", {"order": Order(number="A-1", total=30)})
    wait_until(lambda: task.thread("o1").status == Status.WAITING, timeout=20, what="waiting")
    values = task.state("o1").values
    assert isinstance(values["order"], Order) and values["order"] == Order(number="A-1", total=30)
    assert isinstance(values["refunds"][0], Refund) and values["refunds"] == [Refund("A-1", 15)]
    # A fresh saver, as a worker started after a crash has, reading the stored checkpoint.
    fresh = AgentqSaver(env.store).for_graph(build_typed_graph())
    stored = fresh.get_tuple({"configurable": {"thread_id": "o1"}})
    assert stored is not None
    assert stored.checkpoint["channel_values"]["refunds"] == [Refund("A-1", 15)]
    task.resume("o1", True)
    assert task.wait("o1", timeout=30)["revived"] == ["Order", "Refund"]


def test_an_oversized_super_step_fails_the_thread_naming_the_limit(env: Env) -> None:
    env.store.max_checkpoint_bytes = 300  # the worker's store: it runs in this process
    env.task.delay("t-big", question("refund my order " + "x" * 1000, refunds=1))
    with pytest.raises(ThreadStopped):
        env.task.wait("t-big", timeout=30)
    meta = env.store.meta("t-big")
    assert meta is not None and meta.status == Status.FAILED, meta
    assert meta.error is not None and meta.error.startswith("CheckpointTooLarge: "), meta.error
    assert "max_checkpoint_bytes" in meta.error and "gave up" not in meta.error
