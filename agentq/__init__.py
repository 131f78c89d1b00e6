"""agentq: durable LLM agents on Celery.

Each step of an agent is committed as a checkpoint; a worker that dies loses at most the
step in flight, and tool calls run at most once per idempotency key.
"""

from agentq.app import init_app
from agentq.effects import DID_NOT_RUN, tool
from agentq.function_agent import FunctionAgent, agent
from agentq.outcomes import Done, Interrupt
from agentq.records import Checkpoint, Claim, Effect, Status, ThreadMeta
from agentq.run import NO_VALUE, Run
from agentq.store import open_store
from agentq.task import AgentTask

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
    "Run",
    "Status",
    "ThreadMeta",
    "agent",
    "init_app",
    "open_store",
    "tool",
]
