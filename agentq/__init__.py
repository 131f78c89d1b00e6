"""agentq: durable LLM agents on Celery.

Each step of an agent is committed as a checkpoint; a worker that dies loses at most the
step in flight, and tool calls run at most once per idempotency key.
"""

from agentq import _moved
from agentq.celery.function_agent import FunctionAgent, agent
from agentq.celery.runtime import init_app
from agentq.celery.task import AgentTask
from agentq.engine.run import NO_VALUE, Run
from agentq.engine.tool_policy import DID_NOT_RUN, tool
from agentq.limits import Limit, limit
from agentq.outcomes import Done, Interrupt
from agentq.records import Checkpoint, Claim, Effect, Status, ThreadMeta
from agentq.store import open_store

_moved.install()

__all__ = [
    "DID_NOT_RUN",
    "NO_VALUE",
    "AgentTask",
    "Checkpoint",
    "Claim",
    "Done",
    "Effect",
    "FunctionAgent",
    "Interrupt",
    "Limit",
    "Run",
    "Status",
    "ThreadMeta",
    "agent",
    "init_app",
    "limit",
    "open_store",
    "tool",
]
