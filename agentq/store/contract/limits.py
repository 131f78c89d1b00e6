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


class Slot(NamedTuple):
    """A concurrency slot one call holds on one limit key, to keep for ``ttl`` more seconds."""

    key: str
    holder: str
    ttl: float


class Grant(NamedTuple):
    """A take's answer. ``taken``: committed, and the call may start in ``wait`` seconds
    (0, or its place in the queue of a reservation). Not ``taken``: nothing committed, and
    ``wait`` is the seconds until it could be."""

    taken: bool
    wait: float


class LimitState(NamedTuple):
    """What the store holds of one limit key, read at ``now`` on its clock."""

    now: float
    req_tat: float
    tok_tat: float
    paused: float
    in_flight: int

    def requests_left(self, limit: Limit) -> float | None:
        rpm = limit.requests_per_minute
        if rpm is None:
            return None
        return max(0.0, limit.request_burst - max(self.req_tat - self.now, 0) * rpm / 60)

    def tokens_left(self, limit: Limit) -> float | None:
        tpm = limit.tokens_per_minute
        if tpm is None:
            return None
        return max(0.0, tpm - max(self.tok_tat - self.now, 0) * tpm / 60)


class LimitsContract(ABC):
    """The limit operations of :class:`~agentq.store.contract.Store`. Rates are kept as a
    GCRA (the time the budget is next fully spent up to) on the store's clock."""

    @abstractmethod
    def take_limits(
        self, takes: list[Take], holder: str, ttl: float, reserve_within: float = 0
    ) -> Grant:
        """Take one request, ``cost`` tokens and, where the limit caps concurrency, a slot
        owned by ``holder`` for ``ttl`` seconds, from every key of ``takes`` — all or none.
        Atomic.

        When only the request or token rate is in the way and the take conforms within
        ``reserve_within`` seconds, it is reserved: committed now as if granted, answered
        ``Grant(True, wait)``, and the caller starts ``wait`` seconds later without taking
        again. Waiters thus queue in the rate (the k-th is k intervals away) instead of
        polling for each free slot. A pause or a full concurrency cap is never reserved:
        ``Grant(False, wait)`` with nothing committed."""

    @abstractmethod
    def release_limits(self, keys: list[str], holder: str) -> None:
        """Give back ``holder``'s concurrency slots on ``keys``. Atomic."""

    @abstractmethod
    def pause_limit(self, key: str, seconds: float) -> None:
        """Refuse every take of ``key`` for ``seconds`` from now (never shortens a pause
        already set): the provider said so. Atomic."""

    @abstractmethod
    def limit_paused(self, keys: list[str]) -> float:
        """Seconds until the last pause of ``keys`` ends, on the store's clock; 0 when
        none is paused. Read-only."""

    @abstractmethod
    def limit_states(self) -> dict[str, LimitState]:
        """Every limit key the store has seen taken or paused, with its state. Read-only."""

    @abstractmethod
    def settle_limits(self, settles: list[Take]) -> None:
        """Charge each take's ``cost`` more tokens to its key (a negative cost refunds
        them), for a call whose real usage differed from what it took; keys without a
        token budget are left alone. A refund never makes more than a minute's budget
        free. All keys at once. Atomic."""

    @abstractmethod
    def renew_limits(self, slots: list[Slot]) -> None:
        """Keep each slot its holder still holds for ``ttl`` more seconds from now; a slot
        released or expired meanwhile stays gone. Atomic per slot."""

    @abstractmethod
    def limit_takes(self) -> dict[str, int]:
        """How many takes each limit key has granted since the store began, counting each
        time a thread entered it as its concurrency key (:meth:`enter_key`). Read-only."""
