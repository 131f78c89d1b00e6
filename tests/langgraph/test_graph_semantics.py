"""A graph run by a graph task behaves as the same graph under LangGraph's own saver: an
interrupt answered after its state was edited, a state holding a named tuple, a sibling
branch cancelled while its async tool ran, a sync tool its cancelled ToolNode left running,
retries counted per super-step. An in-process worker with a Redis broker and store."""

from __future__ import annotations

import asyncio
import enum
import operator
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Annotated, Any, NamedTuple, TypedDict, cast

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, interrupt
from pydantic import BaseModel

import agentq
from agentq import Status
from agentq.errors import InvalidArgument, ThreadStopped
from agentq.langgraph import GraphTask, atool_call, graph_task, tool_call
from tests.support.agents import RateLimitError
from tests.support.redis_server import RedisServer, wait_until


class Log(TypedDict, total=False):
    log: Annotated[list[str], operator.add]


class Hits:
    """How often each node or tool of a thread ran, counted in Redis."""

    def __init__(self, url: str, namespace: str) -> None:
        self.client = redis.Redis.from_url(url, decode_responses=True)
        self.namespace = namespace

    def hit(self, config: RunnableConfig, name: str) -> int:
        thread_id = config["configurable"]["thread_id"]
        return int(self.client.hincrby(f"{self.namespace}:hits:{thread_id}", name, 1))

    def of(self, thread_id: str) -> dict[str, int]:
        found = self.client.hgetall(f"{self.namespace}:hits:{thread_id}")
        return {name: int(count) for name, count in found.items()}


def asking() -> StateGraph[Log]:
    def ask(state: Log) -> dict[str, Any]:
        return {"log": ["answer:" + str(interrupt("go on?"))]}

    graph = StateGraph(Log)
    graph.add_node("ask", ask)
    graph.add_edge(START, "ask")
    return graph


class Point(NamedTuple):
    x: int
    y: int


class Color(str, enum.Enum):  # noqa: UP042 (str() is not its value)
    RED = "red"


class Layer(enum.IntEnum):
    TOP = 1


class Shapes(TypedDict, total=False):
    corner: Point
    color: Color
    by_layer: dict[Layer, Color]


def drawing() -> StateGraph[Shapes]:
    graph = StateGraph(Shapes)
    graph.add_node(
        "draw",
        lambda state: {
            "corner": Point(1, 2),
            "color": Color.RED,
            "by_layer": {Layer.TOP: Color.RED},
        },
    )
    graph.add_edge(START, "draw")
    return graph


class Attachment(BaseModel):
    name: str
    data: bytes


class Mail(TypedDict, total=False):
    attachment: Attachment


def attaching() -> StateGraph[Mail]:
    graph = StateGraph(Mail)
    graph.add_node("attach", lambda state: {"attachment": Attachment(name="a.png", data=PNG)})
    graph.add_edge(START, "attach")
    return graph


PNG = b"\x89PNG\r\n\x1a\n"
"""Binary data, which is not UTF-8: a pydantic model's JSON dump cannot hold it."""


def siblings(hits: Hits) -> StateGraph[Log]:
    """Branch ``a`` charges through an async tool; branch ``b`` meets a 429 while it does,
    and LangGraph cancels ``a``."""

    async def a(state: Log, config: RunnableConfig) -> dict[str, Any]:
        async def charge(amount: int) -> str:
            hits.hit(config, "charge-start")
            await asyncio.sleep(0.5)
            return f"charged {amount}"

        return {"log": [await atool_call("call-charge", charge, 10)]}

    async def b(state: Log, config: RunnableConfig) -> dict[str, Any]:
        await asyncio.sleep(0.1)
        if hits.hit(config, "b") == 1:
            raise RateLimitError(retry_after="0.2")
        return {"log": ["b"]}

    graph = StateGraph(Log)
    graph.add_node("a", a)
    graph.add_node("b", b)
    graph.add_edge(START, "a")
    graph.add_edge(START, "b")
    return graph


def flaky_chain(hits: Hits) -> StateGraph[Log]:
    """Five nodes in a row, each meeting one 429 at its first run."""
    graph = StateGraph(Log)
    previous = START
    for n in range(1, 6):

        def node(state: Log, config: RunnableConfig, name: str = f"n{n}") -> dict[str, Any]:
            if hits.hit(config, name) == 1:
                raise RateLimitError(retry_after="0.1")
            return {"log": [name]}

        graph.add_node(f"n{n}", node)
        graph.add_edge(previous, f"n{n}")
        previous = f"n{n}"
    return graph


def sibling_always_limited(hits: Hits) -> StateGraph[Log]:
    """Branch ``a`` succeeds; branch ``b`` meets a 429 every time."""

    def a(state: Log, config: RunnableConfig) -> dict[str, Any]:
        hits.hit(config, "a")
        return {"log": ["a"]}

    def b(state: Log, config: RunnableConfig) -> dict[str, Any]:
        hits.hit(config, "b")
        raise RateLimitError(retry_after="0.05")

    graph = StateGraph(Log)
    graph.add_node("a", a)
    graph.add_node("b", b)
    graph.add_edge(START, "a")
    graph.add_edge(START, "b")
    return graph


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def tools_beside_a_limit(hits: Hits) -> StateGraph[Chat]:
    """An async model asks for two sync tools at once, which a ``ToolNode`` in an async
    graph runs in the loop's executor: ``charge`` is slow, and ``lookup`` meets a 429
    while it runs."""

    async def model(state: Chat) -> dict[str, Any]:
        if any(isinstance(m, ToolMessage) for m in state["messages"]):
            return {"messages": [AIMessage("done", id="ai-2")]}
        calls = [
            {"id": "call-charge", "name": "charge", "args": {"amount": 10}},
            {"id": "call-lookup", "name": "lookup", "args": {}},
        ]
        return {"messages": [AIMessage("", tool_calls=calls, id="ai-1")]}

    @tool
    def charge(
        amount: int, config: RunnableConfig, tool_call_id: Annotated[str, InjectedToolCallId]
    ) -> str:
        """Charge the card."""

        def pay(amount: int) -> str:
            hits.hit(config, "charge-start")
            # A slow payment service: nothing ends this wait early.
            hits.client.blpop([f"{hits.namespace}:never"], timeout=2)
            hits.hit(config, "charge-end")
            return f"charged {amount}"

        return tool_call(tool_call_id, pay, amount)

    @tool
    def lookup(config: RunnableConfig) -> str:
        """Look something up."""
        wait_until(lambda: hit_count(hits, config, "charge-start"), timeout=10, what="charge")
        if hits.hit(config, "lookup") == 1:
            raise RateLimitError(retry_after="0.1")
        return "found"

    def route(state: Chat) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    graph = StateGraph(Chat)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([charge, lookup]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, ["tools", END])
    graph.add_edge("tools", "model")
    return graph


def hit_count(hits: Hits, config: RunnableConfig, name: str) -> int:
    return hits.of(config["configurable"]["thread_id"]).get(name, 0)


def routed_async(*, lambda_node: bool = False) -> StateGraph[Log]:
    """Sync nodes, and an ``async def`` routing function between them (a model-backed
    router, say): only LangGraph's async API runs it. With ``lambda_node`` the router is
    sync, and node ``b`` a ``RunnableLambda`` of an ``async def``."""

    async def route(state: Log) -> str:
        await asyncio.sleep(0)
        return "b"

    async def b(state: Log) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"log": ["b"]}

    graph = StateGraph(Log)
    graph.add_node("a", lambda state: {"log": ["a"]})
    if lambda_node:
        graph.add_node("b", RunnableLambda(b))
        graph.add_edge(START, "a")
        graph.add_edge("a", "b")
        return graph
    graph.add_node("b", lambda state: {"log": ["b"]})
    graph.add_edge(START, "a")
    graph.add_conditional_edges("a", route, ["b", END])
    return graph


def two_questions() -> StateGraph[Log]:
    graph = StateGraph(Log)
    for name in ("a", "b"):
        graph.add_node(name, lambda state, name=name: {"log": [f"{name}:{interrupt(name)}"]})
        graph.add_edge(START, name)
    return graph


GRAPHS: dict[str, Callable[[Hits], StateGraph[Any]]] = {
    "tests.asking": lambda hits: asking(),
    "tests.two_questions": lambda hits: two_questions(),
    "tests.drawing": lambda hits: drawing(),
    "tests.attaching": lambda hits: attaching(),
    "tests.siblings": siblings,
    "tests.flaky_chain": flaky_chain,
    "tests.sibling_always_limited": sibling_always_limited,
    "tests.tools_beside_a_limit": tools_beside_a_limit,
    "tests.routed_async": lambda hits: routed_async(),
    "tests.lambda_async": lambda hits: routed_async(lambda_node=True),
}


class Env:
    def __init__(self, app: Celery, hits: Hits) -> None:
        self.app = app
        self.hits = hits

    def task(self, name: str) -> GraphTask:
        return self.app.tasks[name]


@pytest.fixture
def env(redis_broker: str, redis_server: RedisServer) -> Iterator[Env]:
    prefix = f"gs{uuid.uuid4().hex[:8]}:"
    app = Celery("graph-semantics", broker=redis_broker, set_as_current=False)
    app.conf.update(
        task_default_queue=f"agentq-test-{prefix}",
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
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
    hits = Hits(redis_server.url, prefix.rstrip(":"))
    for name, build in GRAPHS.items():
        graph_task(app, (lambda build=build: build(hits)), name=name, retry_on=(RateLimitError,))
    with start_worker(
        app, pool="threads", concurrency=2, perform_ping_check=False, shutdown_timeout=30
    ):
        yield Env(app, hits)
    hits.client.close()
    app._agentq_runtime.store.close()


def test_an_interrupt_answered_after_its_state_was_edited_takes_the_answer(env: Env) -> None:
    memory = asking().compile(checkpointer=InMemorySaver())
    config: RunnableConfig = {"configurable": {"thread_id": "m"}}
    memory.invoke({"log": []}, config)
    memory.update_state(config, {"log": ["edited"]})
    assert memory.invoke(Command(resume="yes"), config)["log"] == ["edited", "answer:yes"]

    task = env.task("tests.asking")
    task.delay("t1", {"log": []})
    wait_until(lambda: task.thread("t1").status == Status.WAITING, timeout=20, what="waiting")
    task.compiled().update_state({"configurable": {"thread_id": "t1"}}, {"log": ["edited"]})
    task.resume("t1", "yes")
    assert task.wait("t1", timeout=20)["log"] == ["edited", "answer:yes"]


def test_one_answer_to_two_interrupts_is_refused_and_the_thread_keeps_waiting(
    env: Env,
) -> None:
    """LangGraph wants {interrupt_id: value} when several interrupts wait; a plain value
    would fail the thread on the worker, so the resume refuses it, naming the ids."""
    task = env.task("tests.two_questions")
    task.delay("t1", {"log": []})
    wait_until(lambda: task.thread("t1").status == Status.WAITING, timeout=20, what="waiting")
    asked = {i.value: i.id for i in task.state("t1").interrupts}
    with pytest.raises(
        InvalidArgument, match=r"2 interrupts wait .*\{interrupt_id: value\}"
    ) as info:
        task.resume("t1", "yes")
    assert (info.value.thread_id, info.value.step) == ("t1", task.thread("t1").step)
    assert all(i in str(info.value) for i in asked.values())
    with pytest.raises(InvalidArgument):
        task.resume("t1", {"not-an-id": "yes"})
    assert task.thread("t1").status == Status.WAITING
    task.resume("t1", {asked["a"]: "yes", asked["b"]: "no"})
    assert sorted(task.wait("t1", timeout=20)["log"]) == ["a:yes", "b:no"]


def test_a_state_holding_a_named_tuple_or_enums_finishes_as_data(env: Env) -> None:
    """Enum members too, as their values: str() of a (str, Enum) one is not its value."""
    task = env.task("tests.drawing")
    task.delay("t1", {})
    result = task.wait("t1", timeout=20)
    assert result == {"corner": {"x": 1, "y": 2}, "color": "red", "by_layer": {1: "red"}}
    assert type(result["color"]) is str and type(next(iter(result["by_layer"]))) is int
    values = task.state("t1").values
    assert values["corner"] == Point(1, 2) and values["color"] is Color.RED


def test_a_state_holding_a_model_of_binary_data_finishes_as_data(env: Env) -> None:
    """The graph ended, and its checkpoint holds the bytes: so does the thread's result,
    rather than the thread failing after its last step."""
    task = env.task("tests.attaching")
    task.delay("t1", {})
    assert task.wait("t1", timeout=20) == {"attachment": {"name": "a.png", "data": PNG}}
    assert task.state("t1").values["attachment"] == Attachment(name="a.png", data=PNG)


def test_a_sibling_cancelled_while_its_async_tool_runs_is_recorded_not_left_unknown(
    env: Env,
) -> None:
    """LangGraph cancels branch ``a`` when ``b`` fails; its charge, under way, finishes and
    is recorded, so the retried step gets it back rather than stop for a person."""
    task = env.task("tests.siblings")
    task.delay("t1", {"log": []})
    assert sorted(task.wait("t1", timeout=30)["log"]) == ["b", "charged 10"]
    assert env.hits.of("t1")["charge-start"] == 1


def test_rate_limits_at_different_super_steps_are_retried_each(env: Env) -> None:
    """Attempts count per super-step, as they count per node of an AgentTask: five 429s
    at five nodes in a row are five first attempts, not a thread out of attempts."""
    task = env.task("tests.flaky_chain")
    task.delay("t1", {"log": []})
    assert task.wait("t1", timeout=30)["log"] == ["n1", "n2", "n3", "n4", "n5"]
    assert env.hits.of("t1") == {f"n{n}": 2 for n in range(1, 6)}


def test_a_super_step_that_keeps_failing_runs_out_of_attempts(env: Env) -> None:
    """The branch that succeeded is not progress past the super-step: LangGraph replays
    its saved write on each retry, and the failing branch still fails the thread after
    max_attempts, never retried for good."""
    task = env.task("tests.sibling_always_limited")
    task.delay("t1", {"log": []})
    with pytest.raises(ThreadStopped, match="gave up after 5 attempts"):
        task.wait("t1", timeout=30)
    assert env.hits.of("t1") == {"a": 1, "b": 5}


def test_a_sync_tool_still_running_when_its_sibling_fails_ends_before_the_retry(
    env: Env,
) -> None:
    """A ``ToolNode``'s sync tools run in the event loop's executor in an async graph,
    where LangGraph's cancel cannot stop them: the graph task waits for the charge under
    way to be recorded, as the sync graph's executor does, so the retried step gets it
    back rather than find its claim pending and stop for a person."""
    task = env.task("tests.tools_beside_a_limit")
    task.delay("t1", {"messages": [("user", "charge and look up")]})
    result = task.wait("t1", timeout=30)
    assert result["messages"][-1]["content"] == "done"
    assert env.hits.of("t1") == {"charge-start": 1, "charge-end": 1, "lookup": 2}


@pytest.mark.parametrize("name", ["tests.routed_async", "tests.lambda_async"])
def test_a_graph_async_beyond_its_node_functions_runs_with_astream(env: Env, name: str) -> None:
    """As its nodes' ``async def``, an async routing function or ``RunnableLambda`` makes
    the graph one only LangGraph's async API runs."""
    memory = routed_async(lambda_node=name == "tests.lambda_async").compile(
        checkpointer=InMemorySaver()
    )
    config: RunnableConfig = {"configurable": {"thread_id": "m"}}
    assert asyncio.run(memory.ainvoke({"log": []}, config)) == {"log": ["a", "b"]}

    task = env.task(name)
    task.delay("t1", {"log": []})
    assert task.wait("t1", timeout=20) == {"log": ["a", "b"]}


def test_the_graph_factory_runs_once_when_two_threads_start_together(env: Env) -> None:
    """A ``-P threads`` worker given two threads at start runs both at once: the factory,
    which makes the models and clients, still runs once in the process."""
    made: list[StateGraph[Log]] = []
    second = threading.Event()

    def factory() -> StateGraph[Log]:
        made.append(asking())
        if len(made) == 1:
            # Long enough for the other thread to come in, unless something holds it off.
            second.wait(timeout=2)
        else:
            second.set()
        return made[-1]

    task = graph_task(env.app, factory, name="tests.made_once")
    threads = [threading.Thread(target=task.compiled) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(made) == 1
    assert task.compiled().checkpointer is task.saver


def test_a_graph_task_class_whose_init_does_not_call_super_runs(env: Env) -> None:
    """Celery's ``Task`` has no ``__init__`` of its own, and its documentation shows task
    classes that set up state in one without calling ``super().__init__()``: a graph
    task written so still runs its graph."""

    class Counting(GraphTask):
        name = "tests.counting_init"
        graph = staticmethod(asking)

        def __init__(self) -> None:
            self.started = 0

    task = cast(GraphTask, env.app.register_task(Counting()))
    assert task.compiled().checkpointer is task.saver
