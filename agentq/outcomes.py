"""What a node returns, besides the name of the next node."""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from typing import Any

from agentq.errors import InvalidArgument


@dataclass(frozen=True)
class Done:
    """The thread is finished; ``result`` is what ``wait()`` returns."""

    result: Any = None


@dataclass(frozen=True)
class Interrupt:
    """Pause the thread for a human: it becomes ``waiting`` with ``payload`` stored, and
    ``resume(thread_id, value)`` continues at node ``resume_at`` with ``run.resume_value``
    set to ``value``. This node's changes to the state are kept.

    With ``timeout`` (seconds, or a ``timedelta``) the wait ends by itself when no answer
    came in time: the thread continues at ``resume_at`` all the same, where reading
    ``run.resume_value`` raises :class:`~agentq.errors.InterruptTimedOut`."""

    payload: Any
    resume_at: str
    timeout: float | datetime.timedelta | None = None


class Interrupted(Exception):
    """Raised by ``run.interrupt()`` to leave the node; the task turns it into ``waiting``."""

    def __init__(self, payload: Any, timeout: float | None = None) -> None:
        self.payload = payload
        self.timeout = timeout
        super().__init__("interrupted for a human")


class LimitWait(Exception):
    """Raised by a tool call whose limit has no room for longer than ``limit_wait``: the
    task ends the step as ``retrying``, due when the budget allows the call."""

    def __init__(self, keys: tuple[str, ...], seconds: float) -> None:
        self.keys = keys
        self.seconds = seconds
        super().__init__(f"limit {', '.join(keys)} has room in {seconds:.2f} s")


def wait_seconds(
    timeout: float | datetime.timedelta | None, *, thread_id: str, step: int
) -> float | None:
    """The seconds of a wait's ``timeout`` (``None``: no timeout), or
    :class:`~agentq.errors.InvalidArgument` for one that is not a positive duration."""
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise InvalidArgument(
            f"timeout={timeout!r} of a wait for a human is not a duration; pass seconds "
            "(a float) or a datetime.timedelta, or None to wait until resumed",
            thread_id=thread_id,
            step=step,
        )
    if not (math.isfinite(seconds) and seconds > 0):
        raise InvalidArgument(
            f"timeout={timeout!r} of a wait for a human must be positive and finite; pass "
            "the seconds a person has to answer, or None to wait until resumed",
            thread_id=thread_id,
            step=step,
        )
    return seconds
