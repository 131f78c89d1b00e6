"""The rate-limit side of the store contract: budgets every worker takes from at once."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

from agentq.limits import Limit


class Take(NamedTuple):
    """What one call asks of one limit key."""

    key: str
    limit: Limit
    cost: float


class LimitsContract(ABC):
    """The limit operations of :class:`~agentq.store.contract.Store`. Rates are kept as a
    GCRA (the time the budget is next fully spent up to) on the store's clock."""

    @abstractmethod
    def take_limits(self, takes: list[Take], holder: str, ttl: float) -> float:
        """Take one request, ``cost`` tokens and, where the limit caps concurrency, a slot
        owned by ``holder`` for ``ttl`` seconds, from every key of ``takes`` — all or none.
        Returns 0 when taken, else the seconds until it could be (nothing taken). Atomic."""

    @abstractmethod
    def release_limits(self, keys: list[str], holder: str) -> None:
        """Give back ``holder``'s concurrency slots on ``keys``. Atomic."""

    @abstractmethod
    def pause_limit(self, key: str, seconds: float) -> None:
        """Refuse every take of ``key`` for ``seconds`` from now (never shortens a pause
        already set): the provider said so. Atomic."""
