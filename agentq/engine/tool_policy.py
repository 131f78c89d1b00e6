"""Policies for side-effecting tools: what to do when a call's outcome is unknown."""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar, overload

F = TypeVar("F", bound=Callable[..., Any])


class _DidNotRun:
    def __repr__(self) -> str:
        return "DID_NOT_RUN"


DID_NOT_RUN: Final = _DidNotRun()
"""What a ``reconcile`` callback returns when the effect did not happen, so it runs."""


@dataclass(frozen=True)
class ToolPolicy:
    """How ``run.tool`` treats a claim left ``pending`` by a driver that died mid-call.

    ``idempotent``: run the tool again with the same key (it receives the key to forward
    downstream as ``idempotency_key`` if it takes that parameter).
    ``reconcile``: ``reconcile(idempotency_key, *args, **kwargs)`` asks the outside world
    whether the call forwarding that key happened; it returns the effect's result if it
    did, or :data:`DID_NOT_RUN`.
    Neither: the thread stops as ``needs_attention``.
    ``shared``: the key is global across threads (e.g. an invoice number).
    """

    idempotent: bool = False
    reconcile: Callable[..., Any] | None = None
    shared: bool = False


@overload
def tool(fn: F) -> F: ...


@overload
def tool(
    *,
    idempotent: bool = False,
    reconcile: Callable[..., Any] | None = None,
    shared: bool = False,
) -> Callable[[F], F]: ...


def tool(
    fn: F | None = None,
    *,
    idempotent: bool = False,
    reconcile: Callable[..., Any] | None = None,
    shared: bool = False,
) -> F | Callable[[F], F]:
    """Declare a tool's policy once, where it is defined; ``run.tool`` reads it::

    @tool(idempotent=True)
    def charge(amount, *, idempotency_key): ...
    """
    policy = ToolPolicy(idempotent=idempotent, reconcile=reconcile, shared=shared)

    def mark(function: F) -> F:
        function.__agentq_policy__ = policy  # type: ignore[attr-defined]
        return function

    return mark(fn) if fn is not None else mark


_PLAIN_CALLABLES: Final = (types.FunctionType, types.MethodType, types.BuiltinFunctionType)


def policy_of(fn: Callable[..., Any]) -> ToolPolicy:
    """The policy declared on ``fn``, on the tool a ``functools.partial`` binds arguments
    of (which has no attributes of the function's), or on the ``__call__`` of the object
    ``fn`` is: the same tool each time, whose ``shared=True`` lost would let two threads
    each make the call."""
    while True:
        policy = getattr(fn, "__agentq_policy__", None)
        if isinstance(policy, ToolPolicy):
            return policy
        if not isinstance(fn, functools.partial):
            break
        fn = fn.func
    if isinstance(fn, (type, *_PLAIN_CALLABLES)):
        return ToolPolicy()  # the usual tool: no class of its own to look at
    # An object whose class declared its __call__ a tool (a client holding its session).
    policy = getattr(inspect.getattr_static(type(fn), "__call__", None), "__agentq_policy__", None)
    return policy if isinstance(policy, ToolPolicy) else ToolPolicy()
