"""``tool_call`` inside LangChain tools run by LangGraph's ``ToolNode``, the usual way to run
a model's tool calls, which runs the calls of one message in parallel threads (``async def``
tools with ``atool_call``: as tasks on the graph's event loop): each effect is claimed and
recorded under its own tool-call id."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode

import agentq
from agentq.errors import InvalidArgument
from agentq.langgraph import GraphTask, atool_call, graph_task, tool_call
from agentq.store.contract import Store
from tests.support.agents import Ledger
from tests.support.redis_server import RedisServer

ORDERS = ("A-1", "B-2", "C-3")


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def build(ledger: Ledger, thread_id: str, tools: str) -> StateGraph[State]:
    """model (three tool calls in one message) -> ToolNode -> model -> END."""

    def pay(order: str, *, idempotency_key: str) -> dict[str, str]:
        ledger.client.hincrby(ledger.key("calls", thread_id), idempotency_key, 1)
        return {"refunded": order}

    async def apay(order: str, *, idempotency_key: str) -> dict[str, str]:
        await asyncio.sleep(0)
        return pay(order, idempotency_key=idempotency_key)

    @tool
    def refund(order: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
        """Refund an order."""
        return json.dumps(tool_call(tool_call_id, pay, order, idempotent=True))

    @tool("refund")
    async def arefund(order: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
        """Refund an order."""
        return json.dumps(await atool_call(tool_call_id, apay, order, idempotent=True))

    def model(state: State) -> dict[str, Any]:
        if any(isinstance(m, ToolMessage) for m in state["messages"]):
            return {"messages": [AIMessage("All refunded.", id="ai-2")]}
        calls = [
            {"id": f"call-{order}", "name": "refund", "args": {"order": order}} for order in ORDERS
        ]
        return {"messages": [AIMessage("", tool_calls=calls, id="ai-1")]}

    def route(state: State) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    builder = StateGraph(State)
    builder.add_node("model", model)
    builder.add_node("tools", ToolNode([arefund if tools == "async" else refund]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", route, ["tools", END])
    builder.add_edge("tools", "model")
    return builder


@pytest.fixture(params=["sync", "async"])
def tools(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def env(
    backend: str, tools: str, redis_broker: str, redis_server: RedisServer, tmp_path: Path
) -> Iterator[tuple[GraphTask, Ledger, Store]]:
    prefix = f"tn{uuid.uuid4().hex[:8]}:"
    store = redis_server.url if backend == "redis" else f"sqlite:///{tmp_path / 'agentq.db'}"
    app = Celery("agentq-tool-node-tests", broker=redis_broker, set_as_current=False)
    app.conf.update(
        task_default_queue=f"agentq-test-{prefix}",
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    agentq.init_app(app, store=store, prefix=prefix, lease_ttl=3, sweep_interval=0.2, start_grace=5)
    ledger = Ledger(redis_server.url, prefix.rstrip(":"), app._agentq_runtime.store)
    # Only the ToolNode's tools are async, which the graph's nodes do not show.
    task = graph_task(
        app,
        lambda: build(ledger, "t1", tools),
        name="tests.tool_node_graph",
        run_async=tools == "async",
    )
    with start_worker(
        app, pool="threads", concurrency=2, perform_ping_check=False, shutdown_timeout=30
    ):
        yield task, ledger, app._agentq_runtime.store
    app._agentq_runtime.store.close()


def test_parallel_tool_calls_are_each_claimed_once(
    env: tuple[GraphTask, Ledger, Store],
) -> None:
    task, ledger, store = env
    task.delay("t1", {"messages": [("user", "refund all three")]})
    result = task.wait("t1", timeout=30)
    assert result["messages"][-1]["content"] == "All refunded."
    keys = [f"call-{order}" for order in ORDERS]
    assert ledger.tool_calls("t1") == ledger.as_sent("t1", dict.fromkeys(keys, 1))
    for key, order in zip(keys, ORDERS, strict=True):
        effect = store.effect("t1", key)
        assert effect is not None and (effect.state, effect.result) == ("done", {"refunded": order})


def test_outside_a_graph_task_the_tool_simply_runs() -> None:
    """As in a notebook with ``MemorySaver``: no lease to fence a claim with."""

    def pay(order: str, *, idempotency_key: str) -> dict[str, str]:
        return {"refunded": order, "key": idempotency_key}

    async def apay(order: str, *, idempotency_key: str) -> dict[str, str]:
        return pay(order, idempotency_key=idempotency_key)

    expected = {"refunded": "A-1", "key": "call-1"}
    assert tool_call("call-1", pay, "A-1") == expected
    assert asyncio.run(atool_call("call-1", apay, "A-1")) == expected
    assert asyncio.run(atool_call("call-1", pay, "A-1")) == expected


def test_a_call_outside_any_graph_run_warns_that_it_has_no_claim(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A graph a plain invoke runs knows it has no claims; a call outside any graph run is
    most often a node's, made from a thread of its own that did not get the node's
    context, in a graph task where the call would be claimed: said, with the fix."""

    class Log(TypedDict):
        log: list[str]

    def node(state: Log) -> dict[str, Any]:
        with ThreadPoolExecutor(1) as pool:
            in_thread = pool.submit(tool_call, "call-2", lambda: "sent").result()
        return {"log": [tool_call("call-1", lambda: "paid"), in_thread]}

    graph = StateGraph(Log)
    graph.add_node("pay", node)
    graph.add_edge(START, "pay")
    config: RunnableConfig = {"configurable": {"thread_id": "t1"}}
    with caplog.at_level(logging.DEBUG, logger="agentq.langgraph"):
        done = graph.compile(checkpointer=InMemorySaver()).invoke({"log": []}, config)
    assert done == {"log": ["paid", "sent"]}
    [warning] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "call-2 runs without a claim" in warning.getMessage()
    assert "config=config" in warning.getMessage()


def test_outside_a_graph_task_a_tool_needing_a_fencing_token_is_refused_naming_the_fix() -> None:
    """No lease, no token: a clear refusal rather than a TypeError from the tool."""

    def write(row: str, *, fencing_token: int) -> str:
        return row

    def write_maybe(row: str, *, fencing_token: int | None = None) -> str:
        return f"{row}:{fencing_token}"

    with pytest.raises(InvalidArgument, match=r"call-1: .*write takes a fencing_token.*default"):
        tool_call("call-1", write, "r")
    assert tool_call("call-1", write_maybe, "r") == "r:None"
    assert tool_call("call-1", write, "r", fencing_token=7) == "r"


def test_tool_call_refuses_a_coroutine_function_outside_a_graph_task_too() -> None:
    """Inside a graph task ``run.tool`` refuses it; outside, it would return a coroutine
    that never runs."""

    async def apay(order: str) -> str:
        return order

    with pytest.raises(
        InvalidArgument, match=r"call-1: .*apay is a coroutine function.*atool_call"
    ):
        tool_call("call-1", apay, "A-1")
