"""What the driver needs of the task it drives, so that the engine knows nothing of Celery."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from agentq.records import ThreadMeta


class Agent(Protocol):
    """What the driver needs of the task it drives; the Celery side stays in the task.

    Nodes are the agent's methods, looked up by name with :meth:`find_node`.
    """

    @property
    def name(self) -> str: ...
    @property
    def entry_node(self) -> str: ...
    @property
    def append_only(self) -> tuple[str, ...]: ...
    def should_retry(self, exc: BaseException) -> bool: ...
    def on_step(
        self,
        thread_id: str,
        step: int,
        node: str,
        next_node: str | None,
        *,
        limit_waits: Sequence[dict[str, Any]] = (),
    ) -> None: ...
    def on_limit_wait(
        self, thread_id: str, step: int, node: str, limit_waits: Sequence[dict[str, Any]]
    ) -> None: ...
    def resend(self, meta: ThreadMeta) -> Any: ...
    def find_node(self, name: str) -> Callable[..., Any] | None:
        """The node called ``name``, bound to the agent; ``None`` if it defines none."""
        ...
