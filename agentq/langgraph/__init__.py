"""LangGraph on agentq: a checkpoint saver on agentq's stores, and graphs as durable tasks.

Needs the ``langgraph`` extra: ``pip install 'agentq[langgraph]'``.
"""

from agentq.langgraph.saver import AgentqSaver
from agentq.langgraph.serde import AgentqSerializer

__all__ = ["AgentqSaver", "AgentqSerializer"]
