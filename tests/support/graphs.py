"""A LangGraph agent for the tests: a scripted chat model and a refund tool on the ledger.

The same ``Ledger`` as the agentq agents' (:mod:`tests.support.agents`) counts model calls,
tool runs and the refunds the "payment service" applied, and holds the crash points.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Annotated, Any, TypedDict

from celery import Celery
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    ToolCall,
    ToolMessage,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt
from pydantic import BaseModel

import agentq
from agentq import DID_NOT_RUN
from agentq.langgraph import atool_call, current_run, graph_task, tool_call
from tests.support.agents import Ledger, RateLimitError, refund_tool

GRAPH_TASK = "tests.refund_graph"
ASYNC_TOOLS_GRAPH_TASK = "tests.refund_graph_async_tools"
ASYNC_GRAPH_TASK = "tests.async_graph"
TYPED_GRAPH_TASK = "tests.typed_graph"


class ScriptedChatModel(BaseChatModel):
    """Answers from the conversation alone, so a replay asks the same thing: one refund
    tool call per planned refund, then a summary."""

    refunds: int = 1

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        done = sum(isinstance(m, ToolMessage) for m in messages)
        if done < self.refunds:
            call = {"id": f"call-refund-{done + 1}", "name": "refund", "args": {"amount": 10}}
            reply = AIMessage(content="", tool_calls=[call], id=f"ai-{done + 1}")
        else:
            reply = AIMessage(content=f"Refunded {done * 10} EUR.", id=f"ai-{done + 1}")
        return ChatResult(generations=[ChatGeneration(message=reply)])


class State(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    plan: dict[str, Any]
    approved: bool


def build_graph(ledger: Ledger, *, async_tools: bool = False) -> StateGraph[State]:
    """model -> (approve ->) tools -> model ... -> END. With ``async_tools`` the tools node
    is an ``async def`` awaiting an async refund through ``atool_call``."""

    def model(state: State, config: RunnableConfig) -> dict[str, Any]:
        thread_id = config["configurable"]["thread_id"]
        plan = state["plan"]
        calls = ledger.client.incr(ledger.key("model", thread_id))
        if calls <= plan.get("rate_limits", 0):
            raise RateLimitError(retry_after=str(plan.get("retry_after", 1)))
        ledger.crash_point(thread_id, "model")
        if plan.get("slow"):  # a real blocking wait, so a test can act mid-graph
            ledger.client.blpop([ledger.key("never", thread_id)], timeout=plan["slow"])
        reply = ScriptedChatModel(refunds=plan["refunds"]).invoke(state["messages"])
        return {"messages": [reply]}

    def approve(state: State) -> dict[str, Any]:
        decision = interrupt({"question": f"refund {state['plan']['refunds'] * 10} EUR?"})
        return {"approved": bool(decision["approved"])}

    def tools(state: State, config: RunnableConfig) -> dict[str, Any]:
        thread_id = config["configurable"]["thread_id"]
        refund = refund_tool(ledger, thread_id)
        options = _tool_options(ledger, thread_id, state["plan"].get("policy", "idempotent"))
        results = {
            call["id"]: tool_call(call["id"], refund, call["args"]["amount"], **options)
            for call in _calls(state)
        }
        ledger.crash_point(thread_id, "tools_end")
        return _replies(state, results)

    async def atools(state: State, config: RunnableConfig) -> dict[str, Any]:
        thread_id = config["configurable"]["thread_id"]
        refund = refund_tool(ledger, thread_id)
        options = _tool_options(ledger, thread_id, state["plan"].get("policy", "idempotent"))

        async def arefund(amount: int, *, idempotency_key: str) -> dict[str, Any]:
            await asyncio.sleep(0)
            result: dict[str, Any] = refund(amount, idempotency_key=idempotency_key)
            return result

        results = {
            call["id"]: await atool_call(call["id"], arefund, call["args"]["amount"], **options)
            for call in _calls(state)
        }
        ledger.crash_point(thread_id, "tools_end")
        return _replies(state, results)

    builder = StateGraph(State)
    builder.add_node("model", model)
    builder.add_node("approve", approve)
    builder.add_node("tools", atools if async_tools else tools)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", _after_model, ["approve", "tools", END])
    builder.add_edge("approve", "tools")
    builder.add_edge("tools", "model")
    return builder


def _calls(state: State) -> list[ToolCall]:
    """The tool calls of the model's last message, none when the refund was refused."""
    last = state["messages"][-1]
    assert isinstance(last, AIMessage)
    return [] if state.get("approved") is False else last.tool_calls


def _replies(state: State, results: dict[str, Any]) -> dict[str, Any]:
    last = state["messages"][-1]
    assert isinstance(last, AIMessage)
    replies = [
        ToolMessage(
            json.dumps(results.get(call["id"], {"refused": True})),
            tool_call_id=call["id"],
            id=f"tool-{call['id']}",
        )
        for call in last.tool_calls
    ]
    return {"messages": replies}


def _tool_options(ledger: Ledger, thread_id: str, policy: str) -> dict[str, Any]:
    """How ``tool_call`` may treat the refund after a crash: rerun it, ask the ledger, or
    (neither) stop the thread for a person."""
    if policy == "idempotent":
        return {"idempotent": True}
    if policy == "reconcile":

        def reconcile(key: str, amount: int) -> Any:
            applied = ledger.client.hget(ledger.key("effects", thread_id), key)
            if applied is None:
                return DID_NOT_RUN
            return {"refund_id": f"re_{key}", "amount": int(applied)}

        return {"reconcile": reconcile}
    return {}


def _after_model(state: State) -> str:
    last = state["messages"][-1]
    if not (isinstance(last, AIMessage) and last.tool_calls):
        return END
    if state["plan"].get("approval") and "approved" not in state:
        return "approve"
    return "tools"


def question(text: str, **plan: Any) -> dict[str, Any]:
    """The graph's input: a question and the plan the scripted model follows."""
    # A fixed id: add_messages would give the message a random one, and tests compare
    # final states across runs.
    return {"messages": [HumanMessage(text, id="user-1")], "plan": {"refunds": 1, **plan}}


class Count(TypedDict):
    n: int


def build_async_graph(ledger: Ledger) -> StateGraph[Count]:
    """Two ``async def`` nodes, the first awaiting an async tool under its claim."""

    async def double(state: Count, config: RunnableConfig) -> dict[str, Any]:
        run = current_run(config)
        assert run is not None
        thread_id = config["configurable"]["thread_id"]

        async def lookup(n: int) -> int:
            await asyncio.sleep(0)
            ledger.client.hincrby(ledger.key("calls", thread_id), "lookup", 1)
            return n * 2

        return {"n": await run.atool(lookup, state["n"], key="lookup", idempotent=True)}

    async def increment(state: Count) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"n": state["n"] + 1}

    builder = StateGraph(Count)
    builder.add_node("double", double)
    builder.add_node("increment", increment)
    builder.add_edge(START, "double")
    builder.add_edge("double", "increment")
    builder.add_edge("increment", END)
    return builder


class Order(BaseModel):
    number: str
    total: int


@dataclasses.dataclass
class Refund:
    order: str
    amount: int


class Typed(TypedDict, total=False):
    order: Order
    refunds: list[Refund]
    revived: list[str]


def build_typed_graph(ledger: Ledger | None = None) -> StateGraph[Typed]:
    """A state of a pydantic model and dataclasses, stopped by an interrupt between the
    node that makes them and the one that needs them as objects again."""

    def plan(state: Typed) -> dict[str, Any]:
        order = state["order"]
        return {"refunds": [Refund(order.number, order.total // 2)]}

    def confirm(state: Typed, config: RunnableConfig) -> dict[str, Any]:
        interrupt({"question": "refund?"})
        if ledger is not None:
            ledger.crash_point(config["configurable"]["thread_id"], "confirm")
        # What the resumed node got from the checkpoint, for the test to compare.
        return {"revived": [type(state["order"]).__name__, type(state["refunds"][0]).__name__]}

    builder = StateGraph(Typed)
    builder.add_node("plan", plan)
    builder.add_node("confirm", confirm)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "confirm")
    builder.add_edge("confirm", END)
    return builder


def make_graph_app(
    *, broker: str, store: str, prefix: str, queue: str, ledger_url: str, **settings: Any
) -> Celery:
    app = Celery("agentq-graph-tests", broker=broker, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    agentq.init_app(app, store=store, prefix=prefix, **settings)
    ledger = Ledger(ledger_url, prefix.rstrip(":"))
    graph_task(app, lambda: build_graph(ledger), name=GRAPH_TASK, retry_on=(RateLimitError,))
    graph_task(app, lambda: build_graph(ledger, async_tools=True), name=ASYNC_TOOLS_GRAPH_TASK)
    graph_task(app, lambda: build_async_graph(ledger), name=ASYNC_GRAPH_TASK)
    graph_task(app, lambda: build_typed_graph(ledger), name=TYPED_GRAPH_TASK)
    return app
