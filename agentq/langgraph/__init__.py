"""LangGraph on agentq: a checkpoint saver on agentq's stores, and graphs as durable tasks.

Needs the ``langgraph`` extra: ``pip install 'agentq[langgraph]'``.

- :class:`AgentqSaver`: a LangGraph checkpointer on any Redis-API server or agentq's SQLite
  file, that refuses a writer whose lease has passed to another worker.
- :func:`graph_task`: a compiled graph as a durable Celery task (resumes after crashes,
  maps ``interrupt()`` to agentq's ``waiting``, hands over on deploys).
- :func:`tool_call`: a tool's side effect at most once per tool-call id.
"""

from agentq.langgraph.saver import AgentqSaver
from agentq.langgraph.serde import AgentqSerializer
from agentq.langgraph.task import GraphTask, graph_task
from agentq.langgraph.tools import current_run, tool_call

__all__ = ["AgentqSaver", "AgentqSerializer", "GraphTask", "current_run", "graph_task", "tool_call"]
