"""LangGraph on agentq: a checkpoint saver on agentq's stores, and graphs as durable tasks.

Needs the ``langgraph`` extra: ``pip install 'agentq[langgraph]'``.

- :class:`AgentqSaver`: a LangGraph checkpointer on any Redis-API server or agentq's SQLite
  file, that refuses a writer whose lease has passed to another worker.
- :func:`graph_task`: a compiled graph as a durable Celery task (resumes after crashes,
  maps ``interrupt()`` to agentq's ``waiting``, hands over on deploys).
- :func:`tool_call`: a tool's side effect at most once per tool-call id;
  :func:`atool_call` in ``async def`` tools and nodes.

As a checkpointer::

    saver = AgentqSaver.from_url("redis://localhost:6379/1")   # or "sqlite:///agentq.db"
    graph = builder.compile(checkpointer=saver)
    graph.invoke(inputs, {"configurable": {"thread_id": "t-42"}})

As a durable task (the graph's own checkpointer is replaced by the app's store)::

    agentq.init_app(app, store="redis://localhost:6379/1")
    support = graph_task(app, builder, name="support_graph", retry_on=(RateLimitError,))
    support.delay("t-42", {"messages": [("user", "refund my order")]})
    support.resume("t-42", {"approved": True})     # after an interrupt()
    support.wait("t-42")                           # the final state, as plain data

    def refund(state, config):                     # in a node or tool:
        call = state["messages"][-1].tool_calls[0]
        return tool_call(call["id"], payments.refund, call["args"]["amount"],
                         idempotent=True)
"""

from agentq.errors import missing_extra

_EXTRA = frozenset({"langchain_core", "langgraph", "ormsgpack"})
"""What the ``langgraph`` extra installs and these modules import."""

try:
    from agentq.langgraph.saver import AgentqSaver
    from agentq.langgraph.serde import AgentqSerializer
    from agentq.langgraph.task import GraphTask, graph_task
    from agentq.langgraph.tools import atool_call, current_run, tool_call
except ModuleNotFoundError as exc:
    if (exc.name or "").partition(".")[0] not in _EXTRA:
        raise
    raise missing_extra("agentq.langgraph", "langgraph", exc) from exc

__all__ = [
    "AgentqSaver",
    "AgentqSerializer",
    "GraphTask",
    "atool_call",
    "current_run",
    "graph_task",
    "tool_call",
]
