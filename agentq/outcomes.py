"""What a node returns, besides the name of the next node."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Done:
    """The thread is finished; ``result`` is what ``wait()`` returns."""

    result: Any = None


@dataclass(frozen=True)
class Interrupt:
    """Pause the thread for a human: it becomes ``waiting`` with ``payload`` stored, and
    ``resume(thread_id, value)`` continues at node ``resume_at`` with ``run.resume_value``
    set to ``value``. This node's changes to the state are kept."""

    payload: Any
    resume_at: str


class Interrupted(Exception):
    """Raised by ``run.interrupt()`` to leave the node; the task turns it into ``waiting``."""

    def __init__(self, payload: Any) -> None:
        self.payload = payload
        super().__init__("interrupted for a human")


class LimitWait(Exception):
    """Raised by a tool call whose limit has no room for longer than ``limit_wait``: the
    task ends the step as ``retrying``, due when the budget allows the call."""

    def __init__(self, keys: tuple[str, ...], seconds: float) -> None:
        self.keys = keys
        self.seconds = seconds
        super().__init__(f"limit {', '.join(keys)} has room in {seconds:.2f} s")
