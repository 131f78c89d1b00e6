"""The saver under real LangGraph graphs, without Celery: subgraph namespaces, time travel,
``update_state``, a stale writer refused from inside LangGraph's own loop, pydantic objects
and named tuples in the state read back as themselves, and ``DeltaChannel`` rebuilt from
its ancestors (after a prune too)."""

from __future__ import annotations

import operator
import threading
from collections.abc import Sequence
from typing import Annotated, Any, NamedTuple, TypedDict

import pytest
from langchain_core.agents import AgentAction, AgentFinish
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from pydantic import BaseModel

from agentq.errors import CheckpointTooLarge, LeaseHeld, StaleToken, UnserializableState
from agentq.langgraph import AgentqSaver, AgentqSerializer
from agentq.store.contract import Store


class Outer(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    answer: str


class Inner(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    answer: str


def build() -> StateGraph[Outer]:
    def ask(state: Inner) -> dict[str, Any]:
        return {"answer": interrupt("name?"), "log": ["asked"]}

    def greet(state: Inner) -> dict[str, Any]:
        return {"log": [f"hello {state['answer']}"]}

    inner = StateGraph(Inner)
    inner.add_node("ask", ask)
    inner.add_node("greet", greet)
    inner.add_edge(START, "ask")
    inner.add_edge("ask", "greet")
    inner.add_edge("greet", END)

    outer = StateGraph(Outer)
    outer.add_node("start", lambda state: {"log": ["start"]})
    outer.add_node("sub", inner.compile())
    outer.add_node("end", lambda state: {"log": ["end"]})
    outer.add_edge(START, "start")
    outer.add_edge("start", "sub")
    outer.add_edge("sub", "end")
    outer.add_edge("end", END)
    return outer


def run_to_end(saver: Any, thread_id: str) -> Any:
    graph = build().compile(checkpointer=saver)
    config = {"configurable": {"thread_id": thread_id}}
    graph.invoke({"log": []}, config)
    return graph, config, graph.invoke(Command(resume="ann"), config)


def test_a_subgraph_interrupt_resumes_from_its_namespace(store: Store) -> None:
    saver = AgentqSaver(store)
    graph = build().compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "t1"}}
    graph.invoke({"log": []}, config)
    state = graph.get_state(config, subgraphs=True)
    assert state.next == ("sub",)
    [task] = state.tasks
    assert task.state is not None and task.state.next == ("ask",)  # type: ignore[union-attr]
    child_ns = task.state.config["configurable"]["checkpoint_ns"]  # type: ignore[union-attr]
    assert child_ns.startswith("sub:")
    in_child = list(saver.list({"configurable": {"thread_id": "t1", "checkpoint_ns": child_ns}}))
    assert in_child and all(t.config["configurable"]["checkpoint_ns"] == child_ns for t in in_child)
    result = graph.invoke(Command(resume="ann"), config)
    _, _, expected = run_to_end(InMemorySaver(), "m1")
    assert result == expected
    assert result["answer"] == "ann" and result["log"][-2:] == ["hello ann", "end"]


def test_history_time_travel_and_update_state_match_memory_saver(store: Store) -> None:
    results = []
    for saver in (InMemorySaver(), AgentqSaver(store)):
        graph, config, _ = run_to_end(saver, "t1")
        history = list(graph.get_state_history(config))
        before_end = next(h for h in history if h.next == ("end",))
        # Replaying from an earlier checkpoint forks a new branch after it.
        forked = graph.update_state(before_end.config, {"log": ["edited"]})
        replayed = graph.invoke(None, forked)
        results.append(([h.values for h in history], [h.next for h in history], replayed))
    assert results[0] == results[1]
    assert results[1][2]["log"][-2:] == ["edited", "end"]


def test_a_stale_token_stops_the_graph_and_writes_nothing(store: Store) -> None:
    store.open_thread("t1", task="graph")
    old = store.acquire("t1", "worker-a", 30)
    saver = AgentqSaver(store)
    graph = build().compile(checkpointer=saver.bound("t1", old))
    config = {"configurable": {"thread_id": "t1"}}
    graph.invoke({"log": []}, config)
    saved = len(list(saver.list(config)))
    store.acquire("t1", "worker-a", 30)  # the lease moves on: another token
    with pytest.raises(StaleToken):
        graph.invoke(Command(resume="ann"), config, durability="sync")
    assert len(list(saver.list(config))) == saved
    # and without a token, a held lease refuses a write from outside the task
    with pytest.raises(LeaseHeld):
        build().compile(checkpointer=saver).update_state(config, {"log": ["x"]})


class AgentState(TypedDict, total=False):
    input: str
    agent_outcome: AgentAction | AgentFinish | None
    intermediate_steps: Annotated[list[tuple[AgentAction, str]], operator.add]


def agent_graph() -> StateGraph[AgentState]:
    """LangGraph's own conditional agent graph: pydantic ``AgentAction``s in the state."""
    replies = iter(["tool:search:query", "tool:search:another", "finish:answer"])

    def agent(state: AgentState) -> dict[str, Any]:
        reply = next(replies)
        if reply.startswith("finish"):
            return {"agent_outcome": AgentFinish({"answer": reply.split(":")[1]}, reply)}
        _, tool, tool_input = reply.split(":")
        return {"agent_outcome": AgentAction(tool=tool, tool_input=tool_input, log=reply)}

    def tools(state: AgentState) -> dict[str, Any]:
        action = state["agent_outcome"]
        assert isinstance(action, AgentAction)
        return {"intermediate_steps": [(action, f"result for {action.tool_input}")]}

    def should_continue(state: AgentState) -> str:
        return "exit" if isinstance(state["agent_outcome"], AgentFinish) else "continue"

    builder = StateGraph(AgentState)
    builder.add_node("agent", agent)
    builder.add_node("tools", tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", should_continue, {"continue": "tools", "exit": END})
    builder.add_edge("tools", "agent")
    return builder


def run_with_edits(saver: Any) -> list[Any]:
    """Stop after each agent step, read the state, edit it, go on: what LangGraph's
    ``test_conditional_graph_state`` does with every checkpointer."""
    graph = agent_graph().compile(checkpointer=saver, interrupt_after=["agent"])
    config = {"configurable": {"thread_id": "t1"}}
    seen: list[Any] = [list(graph.stream({"input": "weather in sf"}, config))]
    seen.append(graph.get_state(config).values)
    edit = AgentAction(tool="search", tool_input="query", log="a different query")
    graph.update_state(config, {"agent_outcome": edit})
    seen.append(graph.get_state(config).values)
    seen.append(list(graph.stream(None, config)))
    seen.append(graph.get_state(config).values)
    return seen


def test_pydantic_state_comes_back_as_with_memory_saver(store: Store) -> None:
    expected = run_with_edits(InMemorySaver())
    got = run_with_edits(AgentqSaver(store))
    assert got == expected
    assert isinstance(got[1]["agent_outcome"], AgentAction)
    [[action, _]] = got[-1]["intermediate_steps"]
    assert isinstance(action, AgentAction) and action.log == "a different query"


class Inputs(BaseModel):
    a: str
    b: str | None = None


def functional_graph(saver: Any) -> Any:
    """LangGraph's ``test_interrupt_functional_pydantic``: a task's pydantic result,
    stored before an interrupt, is read back on resume."""

    @task
    def foo(state: Inputs) -> Inputs:
        return Inputs(a=state.a + "foo")

    @entrypoint(checkpointer=saver)
    def graph(inputs: Inputs) -> dict[str, Any]:
        pending = foo(inputs)
        value = interrupt("value for b?")
        done = pending.result()
        return {"type": type(done).__name__, "a": done.a, "b": value}

    return graph


def test_a_tasks_pydantic_result_comes_back_on_resume(store: Store) -> None:
    config = {"configurable": {"thread_id": "t1"}}
    graph = functional_graph(AgentqSaver(store))
    graph.invoke(Inputs(a=""), config)
    assert graph.invoke(Command(resume="bar"), config) == {"type": "Inputs", "a": "foo", "b": "bar"}
    # After a crash: a fresh saver told the graph's types, reading what the first wrote.
    restarted = functional_graph(None)
    restarted = restarted.copy(update={"checkpointer": AgentqSaver(store).for_graph(restarted)})
    config = {"configurable": {"thread_id": "t2"}}
    graph.invoke(Inputs(a="x"), config)
    assert restarted.invoke(Command(resume="y"), config) == {
        "type": "Inputs",
        "a": "xfoo",
        "b": "y",
    }


class Price(BaseModel):
    amount: int
    currency: str


class Line(NamedTuple):
    sku: str
    price: Price


class Point(NamedTuple):
    x: int
    y: int


class Order(TypedDict, total=False):
    corner: Point
    lines: list[Line]
    total: int


def order_graph() -> StateGraph[Order]:
    def add_lines(state: Order) -> dict[str, Any]:
        return {"corner": Point(1, 2), "lines": [Line("a", Price(amount=3, currency="EUR"))]}

    def total(state: Order) -> dict[str, Any]:
        # Attribute access: what a node does with a named tuple it declared.
        return {"total": state["corner"].x + sum(line.price.amount for line in state["lines"])}

    builder = StateGraph(Order)
    builder.add_node("add_lines", add_lines)
    builder.add_node("total", total)
    builder.add_edge(START, "add_lines")
    builder.add_edge("add_lines", "total")
    return builder


def test_a_declared_named_tuple_comes_back_as_itself_in_another_process(store: Store) -> None:
    """The worker that wrote it revives it; so must one that resumes the thread after a
    crash, whose saver knows only what the graph declares."""
    config = {"configurable": {"thread_id": "t1"}}
    order_graph().compile(checkpointer=AgentqSaver(store), interrupt_before=["total"]).invoke(
        {}, config
    )
    fresh = AgentqSaver(store).for_graph(order_graph())
    resumed = order_graph().compile(checkpointer=fresh)
    values = resumed.get_state(config).values
    assert values["corner"] == Point(1, 2) and type(values["corner"]) is Point
    [line] = values["lines"]
    assert type(line) is Line and type(line.price) is Price
    assert resumed.invoke(None, config)["total"] == 4


class Loose(TypedDict, total=False):
    n: int
    handle: Any


def test_a_value_msgpack_cannot_hold_is_refused_naming_the_step(store: Store) -> None:
    """The step is the one ``get_state_history`` would have shown for the checkpoint."""
    builder = StateGraph(Loose)
    builder.add_node("count", lambda state: {"n": 1})
    builder.add_node("open", lambda state: {"handle": threading.Lock()})
    builder.add_edge(START, "count")
    builder.add_edge("count", "open")
    graph = builder.compile(checkpointer=AgentqSaver(store))
    config = {"configurable": {"thread_id": "t1"}}
    with pytest.raises(UnserializableState, match="channel 'handle'") as refused:
        graph.invoke({"n": 0}, config, durability="sync")
    assert refused.value.thread_id == "t1" and refused.value.step == 2
    assert str(refused.value).startswith("thread 't1', step 2: ")
    # The checkpoints before it: the input's (-1), START's and count's.
    assert [saved.metadata["step"] for saved in graph.get_state_history(config)] == [1, 0, -1]


def extend(items: list[int] | None, batches: Sequence[list[int]]) -> list[int]:
    return [*(items or []), *(item for batch in batches for item in batch)]


class Counted(TypedDict, total=False):
    items: Annotated[list[int], DeltaChannel(extend, snapshot_frequency=100)]
    n: int


def counting() -> StateGraph[Counted]:
    def count(state: Counted) -> dict[str, Any]:
        return {"items": [state["n"] + 1], "n": state["n"] + 1}

    builder = StateGraph(Counted)
    builder.add_node("count", count)
    builder.add_edge(START, "count")
    builder.add_conditional_edges("count", lambda state: END if state["n"] >= 6 else "count")
    return builder


def test_pruning_keeps_what_a_delta_channel_is_rebuilt_from(store: Store) -> None:
    """A ``DeltaChannel`` stores no value until its snapshot; LangGraph rebuilds it from
    the ancestors' writes, so keeping only the latest checkpoint would empty it."""
    saver = AgentqSaver(store)
    graph = counting().compile(checkpointer=saver, interrupt_before=["count"])
    config = {"configurable": {"thread_id": "t1"}}
    graph.invoke({"items": [0], "n": 0}, config)
    for _ in range(3):
        graph.invoke(None, config)
    assert graph.get_state(config).values == {"items": [0, 1, 2, 3], "n": 3}
    saver.prune(["t1"])
    assert graph.get_state(config).values == {"items": [0, 1, 2, 3], "n": 3}
    while graph.get_state(config).next:
        graph.invoke(None, config)
    assert graph.get_state(config).values == {"items": [0, 1, 2, 3, 4, 5, 6], "n": 6}
    # A graph without one keeps only its latest checkpoint, as before.
    plain = build().compile(checkpointer=saver)
    plain_config = {"configurable": {"thread_id": "t2"}}
    plain.invoke({"log": []}, plain_config)
    saver.prune(["t2"])
    assert len(list(saver.list(plain_config))) == 2  # the root's and the subgraph's


class Counting(AgentqSerializer):
    """Counts the values it reads that hold ``marker``."""

    def __init__(self, marker: bytes) -> None:
        super().__init__()
        self.marker = marker
        self.read = 0

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        if self.marker in data[1]:
            self.read += 1
        return super().loads_typed(data)


class Document(TypedDict, total=False):
    items: Annotated[list[int], DeltaChannel(extend, snapshot_frequency=100)]
    body: str
    n: int


def test_rebuilding_a_delta_channel_reads_only_that_channel_of_each_ancestor(
    store: Store,
) -> None:
    """LangGraph walks back through every checkpoint since the channel's snapshot: each
    read of the thread would otherwise load the whole state of each of them."""
    builder = StateGraph(Document)
    builder.add_node("count", lambda state: {"items": [state["n"]], "n": state["n"] + 1})
    builder.add_edge(START, "count")
    builder.add_conditional_edges("count", lambda state: END if state["n"] >= 10 else "count")
    serde = Counting(b"large body")
    graph = builder.compile(checkpointer=AgentqSaver(store, serde=serde))
    config = {"configurable": {"thread_id": "t1"}}
    graph.invoke({"items": [], "n": 0, "body": "large body"}, config)
    serde.read = 0
    state = graph.get_state(config)
    assert state.values == {"items": list(range(10)), "n": 10, "body": "large body"}
    assert serde.read == 1  # the latest checkpoint's, none of its ten ancestors'
    history = BaseCheckpointSaver.get_delta_channel_history
    saver = AgentqSaver(store)
    for saved in graph.get_state_history(config):
        assert saver.get_delta_channel_history(
            config=saved.config, channels=["items", "n"]
        ) == history(saver, config=saved.config, channels=["items", "n"])


class Doc(TypedDict, total=False):
    text: str
    words: int


def test_an_oversized_state_is_refused_and_what_is_stored_stays(store: Store) -> None:
    # As an agent's checkpoint: the store's bound applies to what a super-step writes.
    store.max_checkpoint_bytes = 4096

    def fetch(state: Doc) -> dict[str, Any]:
        return {"text": "x" * 10_000}

    def count(state: Doc) -> dict[str, Any]:
        return {"words": len(state["text"].split())}

    builder = StateGraph(Doc)
    builder.add_node("fetch", fetch)
    builder.add_node("count", count)
    builder.add_edge(START, "fetch")
    builder.add_edge("fetch", "count")
    builder.add_edge("count", END)
    graph = builder.compile(checkpointer=AgentqSaver(store))
    config = {"configurable": {"thread_id": "t-big"}}
    with pytest.raises(CheckpointTooLarge) as refused:
        graph.invoke({"text": "small"}, config)
    # Refused first as fetch's pending write, before step 1's checkpoint.
    assert refused.value.thread_id == "t-big" and "LangGraph node 'fetch'" in str(refused.value)
    assert refused.value.limit == 4096 and (refused.value.size or 0) > 10_000
    assert "max_checkpoint_bytes" in str(refused.value)
    # Nothing of step 1 was stored: the super-step before is the latest checkpoint, whole
    # and without fetch's output, and the graph runs on from it.
    history = list(graph.get_state_history(config))
    assert [snapshot.metadata["step"] for snapshot in history] == [0, -1]
    assert history[0].values == {"text": "small"} and history[0].tasks[0].name == "fetch"
    assert history[0].tasks[0].result is None
    store.max_checkpoint_bytes = 1 << 20
    assert graph.invoke(None, config) == {"text": "x" * 10_000, "words": 1}
