"""agentq: durable LLM agents on Celery."""

from agentq.records import Checkpoint, Claim, Effect, Status, ThreadMeta

__all__ = ["Checkpoint", "Claim", "Effect", "Status", "ThreadMeta"]
