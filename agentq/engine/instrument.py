"""The driver's hooks into tracing and metrics, as decorators of its methods, so the
driver reads as what it does and each hook costs a line there."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar

from agentq.engine import metrics, tracing
from agentq.records import Status

F = TypeVar("F", bound=Callable[..., Any])


def step(fn: F) -> F:
    """``Driver._step`` runs in its node's span."""

    @functools.wraps(fn)
    def traced(self: Any, token: int, meta: Any, pos: Any, *args: Any) -> Any:
        with tracing.node_span(
            self.thread_id, meta.options, pos.step, pos.node, pos.attempts + 1, token
        ):
            return fn(self, token, meta, pos, *args)

    return traced  # type: ignore[return-value]


def settle(fn: F) -> F:
    """``Driver._settle``: the status a node run leaves its thread in is its outcome, once
    the store took it (a worker fenced out by a takeover did not leave it so)."""

    @functools.wraps(fn)
    def noted(self: Any, what: str, token: int, status: Status, **fields: Any) -> Any:
        result = fn(self, what, token, status, **fields)
        tracing.outcome(self.thread_id, status.value)
        return result

    return noted  # type: ignore[return-value]


def retry(fn: F) -> F:
    """``Driver._fail_or_retry``: returning (rather than raising) scheduled a retry."""

    @functools.wraps(fn)
    def counted(self: Any, token: int, step: int, attempts: int, exc: Exception) -> Any:
        result = fn(self, token, step, attempts, exc)
        metrics.retried(exc)
        tracing.raised(self.thread_id, exc)
        return result

    return counted  # type: ignore[return-value]


def commit(thread_id: str, fn: F) -> F:
    """``Store.commit``, timed and counted once it succeeds."""

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        result = fn(*args, **kwargs)
        metrics.committed(time.perf_counter() - started)
        status = kwargs.get("status", Status.RUNNING)
        tracing.outcome(thread_id, "committed" if status == Status.RUNNING else status.value)
        return result

    return timed  # type: ignore[return-value]
