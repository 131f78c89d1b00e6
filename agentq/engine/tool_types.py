"""The shapes a type checker matches a tool call against, so that ``run.tool(fn, ...)``
checks its arguments against ``fn`` beside the call's own keyword options.

A tool may declare ``idempotency_key`` and ``fencing_token``, which the run passes and
the caller does not: the protocols below are ``fn`` with those taken out of its
signature. Each is used in a union with ``Callable[[*Ts], R]``, from which a type
checker infers the tool's result where it cannot from the protocol alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypedDict, TypeVar, TypeVarTuple

R_co = TypeVar("R_co", covariant=True)
Ts = TypeVarTuple("Ts")


class PolicyOptions(TypedDict, total=False):
    """The options of a tool call over the tool's declared policy."""

    idempotent: bool | None
    reconcile: Callable[..., Any] | None
    shared: bool | None
    limit: str | Sequence[str] | None
    cost: float
    actual_cost: Callable[[Any], float] | None


class ToolOptions(PolicyOptions, total=False):
    """The keyword options of ``run.tool``/``run.atool`` beside the tool's arguments."""

    key: str | None


class TakesKey(Protocol[*Ts, R_co]):
    """A tool taking ``idempotency_key``: positional ``Ts`` are the caller's."""

    def __call__(self, *args: *Ts, idempotency_key: str) -> R_co: ...


class TakesToken(Protocol[*Ts, R_co]):
    """A tool taking ``fencing_token``: positional ``Ts`` are the caller's."""

    def __call__(self, *args: *Ts, fencing_token: int) -> R_co: ...


class TakesKeyAndToken(Protocol[*Ts, R_co]):
    """A tool taking both ``idempotency_key`` and ``fencing_token``."""

    def __call__(self, *args: *Ts, idempotency_key: str, fencing_token: int) -> R_co: ...
