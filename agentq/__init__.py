"""agentq: durable LLM agents on Celery.

Each step of an agent is committed as a checkpoint; a worker that dies loses at most the
step in flight, and tool calls run at most once per idempotency key.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any, Final

from agentq import _moved

if TYPE_CHECKING:
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

_HOMES: Final = {
    "DID_NOT_RUN": "agentq.engine.tool_policy",
    "NO_VALUE": "agentq.engine.run",
    "AgentTask": "agentq.celery.task",
    "Checkpoint": "agentq.records",
    "Claim": "agentq.records",
    "Done": "agentq.outcomes",
    "Effect": "agentq.records",
    "FunctionAgent": "agentq.celery.function_agent",
    "Interrupt": "agentq.outcomes",
    "Limit": "agentq.limits",
    "Run": "agentq.engine.run",
    "Status": "agentq.records",
    "ThreadMeta": "agentq.records",
    "agent": "agentq.celery.function_agent",
    "init_app": "agentq.celery.runtime",
    "limit": "agentq.limits",
    "open_store": "agentq.store",
    "tool": "agentq.engine.tool_policy",
}
"""Where each public name lives. They are imported on first use, so that a module of the
package (``celery``'s entry point for ``celery agentq``, which every ``celery`` command
loads) does not pay for Celery's task machinery and the stores."""

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


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        # A module of the package, as ``import agentq`` once loaded them all:
        # ``agentq.errors.LeaseLost`` in an ``except`` keeps working.
        if not name.startswith("_") and importlib.util.find_spec(f"agentq.{name}") is not None:
            return importlib.import_module(f"agentq.{name}")
        raise AttributeError(f"module 'agentq' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
