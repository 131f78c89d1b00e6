"""The app of a ``celery worker`` subprocess (``-A``) whose graph has four nodes in a row,
each of the first three blocking the first time it runs in a thread, until the test
SIGKILLs its worker."""

from __future__ import annotations

import operator
import os
from typing import Annotated, Any, TypedDict

import redis
from celery import Celery
from langchain_core.runnables import RunnableConfig
from langgraph.graph import START, StateGraph

import agentq
from agentq.langgraph import graph_task

CRASHY = "tests.crashy_chain"


class Log(TypedDict, total=False):
    log: Annotated[list[str], operator.add]


def crashy_chain(url: str, ns: str) -> StateGraph[Log]:
    client = redis.Redis.from_url(url, decode_responses=True)
    graph = StateGraph(Log)
    previous = START
    for i in range(1, 5):

        def node(state: Log, config: RunnableConfig, name: str = f"k{i}") -> dict[str, Any]:
            thread_id = config["configurable"]["thread_id"]
            client.hincrby(f"{ns}:hits:{thread_id}", name, 1)
            if name != "k4" and client.set(f"{ns}:fired:{thread_id}:{name}", 1, nx=True):
                client.set(f"{ns}:reached:{thread_id}:{name}", 1)
                while True:  # until the test kills this worker
                    client.blpop([f"{ns}:never"], timeout=1)
            return {"log": [name]}

        graph.add_node(f"k{i}", node)
        graph.add_edge(previous, f"k{i}")
        previous = f"k{i}"
    return graph


def make_app(
    *, broker: str, store: str, prefix: str, queue: str, ledger_url: str, **settings: Any
) -> Celery:
    app = Celery("crashy-graph", broker=broker, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=1,
    )
    agentq.init_app(app, store=store, prefix=prefix, **settings)
    ns = prefix.rstrip(":")
    graph_task(app, lambda: crashy_chain(ledger_url, ns), name=CRASHY)
    return app


if os.environ.get("AGENTQ_TEST_QUEUE"):
    app = make_app(
        broker=os.environ["AGENTQ_TEST_BROKER"],
        store=os.environ["AGENTQ_TEST_STORE"],
        prefix=os.environ["AGENTQ_TEST_PREFIX"],
        queue=os.environ["AGENTQ_TEST_QUEUE"],
        ledger_url=os.environ["AGENTQ_TEST_LEDGER"],
        lease_ttl=float(os.environ.get("AGENTQ_TEST_LEASE_TTL", "2")),
        sweep_interval=0.2,
        start_grace=3,
    )
