"""What a finished agent thread occupies in the store, against the size of its final state;
and the same conversation kept by LangGraph's SQLite saver.

Run from the repository root::

    python -m bench.storage [--quick]

The thread: 200 steps, 267 messages (a question; 100 model steps, of which 99 ask for one
or two tools and the last answers; 99 tools steps running 166 tool calls under idempotency
claims), ``messages`` append-only, ``keep_last`` at its default. It runs in this process
through ``AgentTask`` and its driver on a private redis-server with AOF always (no worker
is needed to measure what is stored). ``--quick`` runs the same thread: it takes a second.

Store size is the sum of ``MEMORY USAGE <key> SAMPLES 0`` over every key the thread owns
(its meta, latest pointer, lease, snapshots, logs, effect records; not its member entries
in the global status/due indexes, a few dozen bytes): what Redis holds in RAM, with its
per-key overhead. The payload (``STRLEN``, list items, hash fields and values) is shown
beside it. Final state size is the thread's state at its last checkpoint, encoded by
agentq's codec. Target: store ÷ final state ≤ 3.

LangGraph: the same nodes and messages in a ``StateGraph`` (``messages`` with an ``add``
reducer) checkpointed by ``SqliteSaver`` with ``durability="sync"``; size is the database
file after the connection is closed (its WAL checkpointed into it), divided by the same
final state size. Skipped when langgraph-checkpoint-sqlite is not installed.
"""

from __future__ import annotations

import importlib.util
import operator
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

import redis
from celery import Celery

import agentq
from agentq import AgentTask, Done, Run
from agentq.codec.envelope import encode_value
from agentq.store.redis.store import RedisStore
from bench import _chat
from bench._redis import PrivateRedis
from bench._report import Result, Target, exit_with, size, skipped, standalone

STEPS = 200
MESSAGES = 267
ROUNDS = (STEPS - 2) // 2  # model + tools pairs after the start step, before the answer
DOUBLE = MESSAGES - 2 - 2 * ROUNDS  # rounds whose model asks for two tools
TARGET = Target(3.0)
THREAD = "storage-thread"


# -- the conversation, shared by both frameworks -----------------------------------------------


def model_reply(round_: int) -> dict[str, Any]:
    """The model's message in ``round_``: one or two tool calls, or the final answer."""
    if round_ >= ROUNDS:
        return _chat.answer(round_)
    message = _chat.reply(round_)
    if round_ < DOUBLE:
        message["tool_calls"] = [
            *message["tool_calls"],
            {**message["tool_calls"][0], "id": f"call-{round_}b"},
        ]
    return message


def search(call: dict[str, Any]) -> dict[str, Any]:
    """The tool: a result of ~300 bytes for its call."""
    result = _chat.tool_result(len(call["id"]))
    result["tool_call_id"] = call["id"]
    return result


class StorageAgent(AgentTask):
    name = "bench.storage_agent"
    append_only = ("messages",)

    def start(self, run: Run) -> str:
        run.state.update(messages=[_chat.user(0)], round=0)
        return "model"

    def model(self, run: Run) -> Any:
        message = model_reply(run.state["round"])
        run.state["messages"].append(message)
        if "tool_calls" not in message:
            return Done(message["content"][:40])
        run.pending = message["tool_calls"]
        return "tools"

    def tools(self, run: Run) -> str:
        for call in run.pending:
            run.state["messages"].append(run.tool(search, call, key=call["id"]))
        run.pending = []
        run.state["round"] += 1
        return "model"


def run_agentq(store: RedisStore) -> dict[str, Any]:
    """Run the thread to its end in this process; return its final state."""
    app = Celery("agentq-bench-storage", set_as_current=False)
    try:
        agentq.init_app(app, store=store)
        agent = app.register_task(StorageAgent())
        store.open_thread(THREAD, task=agent.name)
        agent.run(THREAD)
        latest = store.latest(THREAD)
        assert latest is not None and latest.step == STEPS - 1, latest
        assert len(latest.state["messages"]) == MESSAGES
        return latest.state
    finally:
        app.close()


def _payload(client: redis.Redis, key: bytes) -> int:
    kind = client.type(key)
    if kind == b"string":
        return int(client.strlen(key))
    if kind == b"list":
        return sum(len(item) for item in client.lrange(key, 0, -1))
    if kind == b"hash":
        return sum(len(k) + len(v) for k, v in client.hgetall(key).items())
    if kind == b"set":
        return sum(len(member) for member in client.smembers(key))
    raise RuntimeError(f"unexpected {kind!r} key {key!r}")


def measure_keys(client: redis.Redis, store: RedisStore) -> tuple[dict[str, int], int, int]:
    """``(memory usage by kind of key, payload bytes, keys)`` of every key the thread owns;
    the kind is the first part of the key after the thread's prefix (``log``, ``effect``)."""
    prefix = store.keys.thread(THREAD)
    keys = list(client.scan_iter(match=prefix + "*", count=1000))
    memory: dict[str, int] = {}
    for key in keys:
        kind = key.decode()[len(prefix) :].split(":")[0]
        memory[kind] = memory.get(kind, 0) + int(client.memory_usage(key, samples=0) or 0)
    return memory, sum(_payload(client, key) for key in keys), len(keys)


# -- LangGraph ----------------------------------------------------------------------------------


class GraphState(TypedDict):
    messages: Annotated[list[dict[str, Any]], operator.add]
    round: int


def run_langgraph(path: Path) -> int:
    """Run the same conversation through LangGraph + SqliteSaver; return the DB's size."""
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    def start(state: GraphState) -> dict[str, Any]:
        return {"messages": [_chat.user(0)], "round": 0}

    def model(state: GraphState) -> dict[str, Any]:
        return {"messages": [model_reply(state["round"])]}

    def tools(state: GraphState) -> dict[str, Any]:
        calls = state["messages"][-1]["tool_calls"]
        return {"messages": [search(call) for call in calls], "round": state["round"] + 1}

    def route(state: GraphState) -> str:
        return "tools" if "tool_calls" in state["messages"][-1] else END

    graph = StateGraph(GraphState)
    graph.add_node("start", start)
    graph.add_node("model", model)
    graph.add_node("tools", tools)
    graph.add_edge(START, "start")
    graph.add_edge("start", "model")
    graph.add_conditional_edges("model", route, ["tools", END])
    graph.add_edge("tools", "model")
    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        compiled = graph.compile(checkpointer=SqliteSaver(conn))
        final = compiled.invoke(
            {"messages": [], "round": 0},
            {"configurable": {"thread_id": THREAD}, "recursion_limit": 10 * STEPS},
            durability="sync",
        )
        assert len(final["messages"]) == MESSAGES, len(final["messages"])
    finally:
        conn.close()
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def _langgraph_row(final_bytes: int, runner: Callable[[Path], int]) -> Result:
    name, what = "storage_langgraph_sqlite_over_state", "LangGraph SqliteSaver DB ÷ final state"
    try:
        found = importlib.util.find_spec("langgraph.checkpoint.sqlite") is not None
    except ModuleNotFoundError:  # no langgraph at all: its parent package is missing
        found = False
    if not found:
        return skipped("ratio", name, what, "langgraph not installed")
    with tempfile.TemporaryDirectory(prefix="agentq-bench-lg-") as directory:
        db = runner(Path(directory) / "checkpoints.sqlite")
    return Result(
        "ratio", name, db / final_bytes, what, f"{size(db)} (file)", f"{size(final_bytes)} state"
    )


def run(quick: bool) -> list[Result]:
    del quick  # one thread of 200 steps is small already
    with PrivateRedis() as server:
        client = server.client()
        try:
            store = RedisStore(client)
            state = run_agentq(store)
            by_kind, payload, keys = measure_keys(client, store)
        finally:
            client.close()
    memory = sum(by_kind.values())
    largest = sorted(by_kind.items(), key=lambda item: -item[1])[:3]
    final = len(encode_value(state, what="state", thread_id=THREAD, step=None))
    return [
        Result(
            "ratio",
            "storage_redis_over_state",
            memory / final,
            f"store after {STEPS} steps ÷ final state ({MESSAGES} msgs)",
            f"{size(memory)} in {keys} keys (MEMORY USAGE)",
            f"{size(final)} state",
            TARGET,
            ", ".join(f"{kind} {size(n)}" for kind, n in largest),
        ),
        Result(
            "ratio",
            "storage_redis_payload_over_state",
            payload / final,
            "  payload only (strings, list items, hash fields)",
            size(payload),
            f"{size(final)} state",
        ),
        _langgraph_row(final, run_langgraph),
    ]


def main(argv: list[str] | None = None) -> int:
    return standalone("python -m bench.storage", __doc__, run, argv)


if __name__ == "__main__":
    exit_with(main)
