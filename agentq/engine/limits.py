"""Taking a tool call's share of fleet-wide limits before it runs, and a 429's pause after.

A wait up to ``limit_wait`` happens in place (reserved by the store when only the rate
is in the way, so waiters queue rather than poll, and a reserved call whose key a
refusal paused meanwhile waits the pause out too); a longer one raises
:class:`~agentq.outcomes.LimitWait`, so the step ends as ``retrying`` and frees its pool
slot instead of sleeping on the budget. Concurrency slots are owned by one call (a
holder id) and expire with the lease TTL, renewed with the lease while the call runs, so a
worker killed mid-call gives them back and a long call keeps them. A call that knows its
real token usage afterwards settles the difference from what it took.
"""

from __future__ import annotations

import functools
import logging
import math
import random
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from agentq.engine.backoff import retry_after
from agentq.engine.lease import Lease
from agentq.engine.store_retry import RetriedCalls
from agentq.errors import LimitError
from agentq.limits import Limits
from agentq.outcomes import LimitWait
from agentq.settings import Settings
from agentq.store.contract.limits import Take

logger = logging.getLogger("agentq")


class Held:
    """The limits one call took, after waiting ``waited`` seconds in place for them; give
    them back with :meth:`release`. A provider's refusal pauses them for at most
    ``pause_max`` seconds."""

    def __init__(
        self,
        calls: RetriedCalls,
        takes: tuple[Take, ...],
        holder: str,
        *,
        waited: float,
        lease: Lease | None,
        where: str,
        pause_max: float,
    ) -> None:
        self.calls = calls
        self.store = calls.store
        self.takes = takes
        self.keys = tuple(take.key for take in takes)
        self.holder = holder
        self.waited = waited
        self._lease = lease
        self._where = where
        self._pause_max = pause_max
        self._slotted = tuple(take.key for take in takes if take.limit.concurrency)
        if lease is not None and self._slotted:
            lease.hold_slots(holder, self._slotted)

    def release(self) -> None:
        """Give back the call's concurrency slots: a rate-only limit holds none, and costs
        no round trip here."""
        if not self._slotted:
            return
        if self._lease is not None:
            self._lease.drop_slots(self.holder)
        self._once(
            f"give back the slots of {', '.join(self._slotted)} now; they free themselves "
            "when their lease runs out",
            self.store.release_limits,
            list(self._slotted),
            self.holder,
        )

    def _once(self, what: str, call: Callable[..., None], *args: Any) -> None:
        """``call(*args)``, not sent again after a passing store error, which is logged:
        the tool call has run, and a store that cannot answer now must not take its result
        (or its error) from the caller, which would leave its claim unrecorded."""
        try:
            call(*args)
        except Exception as exc:
            if not self.store.is_transient(exc):
                raise
            logger.warning("%s: could not %s (%s)", self._where, what, exc)

    def settle(self, actual_cost: Callable[[Any], float], result: Any) -> None:
        """Charge or refund the difference between the tokens taken and
        ``actual_cost(result)``, the call's real usage."""
        try:
            cost = actual_cost(result)
        except Exception as exc:
            raise LimitError(
                f"{self._where}: actual_cost raised {exc!r} on the tool's result; make it "
                'return the tokens the call used (e.g. lambda r: r["usage"]["total_tokens"])'
            ) from exc
        if not _tokens(cost):
            raise LimitError(
                f"{self._where}: actual_cost returned {cost!r}; it must return the tokens "
                "the call used, a finite number of zero or more"
            )
        taken = self.takes[0].cost
        if cost != taken:
            # A difference sent twice would be charged twice: the estimate stands instead.
            self._once(
                f"settle the tokens of {', '.join(self.keys)}; the estimate stands",
                self.store.settle_limits,
                [take._replace(cost=cost - taken) for take in self.takes],
            )

    def refused(self, exc: BaseException) -> None:
        """A provider's refusal with Retry-After pauses every key for the whole fleet."""
        seconds = retry_after(exc)
        if seconds is not None and seconds > 0:
            # Capped as the step's own retry is (backoff_max): a longer pause would make
            # the retried step wait it out regardless, and an infinite or absurd
            # Retry-After would pause the key for good, or past what a store can hold.
            seconds = min(seconds, self._pause_max)
            for key in self.keys:
                self.calls("pausing a limit", self.store.pause_limit, key, seconds)


def take(
    calls: RetriedCalls,
    limits: Limits,
    names: str | Sequence[str],
    cost: float,
    *,
    ttl: float,
    wait: float,
    step: int,
    pause_max: float,
    lease: Lease | None = None,
) -> Held:
    """Take one request and ``cost`` tokens of each key in ``names`` for ``calls``'s
    thread, waiting up to ``wait`` seconds in place; :class:`~agentq.outcomes.LimitWait`
    past that. A refusal of the call pauses the keys for at most ``pause_max`` seconds."""
    thread_id = calls.thread_id
    where = f"thread {thread_id} step {step}"
    if isinstance(names, str):
        keys: tuple[str, ...] = (names,)
    elif isinstance(names, Sequence) and names:
        keys = tuple(names)
    else:
        # An empty tuple would take nothing, and leave settle nothing to settle.
        raise LimitError(
            f"{where}: limit={names!r} names no limit key; pass one ('openai') or a tuple of them"
        )
    if not _tokens(cost):
        raise LimitError(
            f"{where}: cost={cost!r} is not a token count; pass the call's estimated tokens, "
            "a finite number of zero or more"
        )
    takes = []
    for key in keys:
        try:
            limit = limits.for_call(key)
        except LimitError as exc:
            raise LimitError(f"{where}: {exc}") from None
        if limit.tokens_per_minute is not None and cost > limit.tokens_per_minute:
            raise LimitError(
                f"{where}: cost {cost:g} is over limit {key!r}'s "
                f"tokens_per_minute ({limit.tokens_per_minute:g}), so it could never run; "
                "split the call or raise the limit"
            )
        takes.append(Take(key, limit, cost))
    holder = f"{thread_id}:{uuid.uuid4().hex}"
    deadline, waited = time.monotonic() + wait, 0.0
    while True:
        # A wait on the rate within what is left of ``wait`` is reserved by the store: the
        # call starts after it without taking again, and later callers queue behind it.
        # Resent after a lost reply, a take may charge the rate twice: the budget errs low.
        granted = calls(
            "taking a limit",
            lambda: calls.store.take_limits(
                takes, holder, ttl, max(deadline - time.monotonic(), 0)
            ),
        )
        if granted.taken:
            held = Held(
                calls,
                tuple(takes),
                holder,
                waited=waited,
                lease=lease,
                where=where,
                pause_max=pause_max,
            )
            if granted.wait > 0:
                try:
                    time.sleep(granted.wait)
                    held.waited += granted.wait
                    _honour_pauses(calls, held, deadline)
                except BaseException:
                    held.release()  # the slot, not the rate: that reservation is spent
                    raise
            return held
        if time.monotonic() + granted.wait > deadline:
            # Callers refused together meet the same wait (the queue's length) and would
            # come back together, each time all but a few refused again: up to 10% more
            # spreads them, and the queue waiting in place keeps the rate busy meanwhile.
            raise LimitWait(keys, granted.wait * (1 + random.random() * 0.1))
        time.sleep(granted.wait)
        waited += granted.wait


def _honour_pauses(calls: RetriedCalls, held: Held, deadline: float) -> None:
    """Wait out, in place up to ``deadline`` (else :class:`~agentq.outcomes.LimitWait`),
    a pause set on ``held``'s keys while its reservation waited for its turn: the take
    checked for pauses when it reserved, and a call ahead refused with Retry-After
    meanwhile means this one, sent now, would be refused too."""
    while True:
        paused = calls("reading a limit's pause", calls.store.limit_paused, list(held.keys))
        if paused <= 0:
            return
        if time.monotonic() + paused > deadline:
            # As a refused take's wait: spread, so that the queue paused together does
            # not all come back at once.
            raise LimitWait(held.keys, paused * (1 + random.random() * 0.1))
        time.sleep(paused)
        held.waited += paused


def _tokens(count: object) -> bool:
    """Whether ``count`` is a number of tokens: NaN or infinity would be stored as the
    time the budget is next free, and no take would ever be right again."""
    return not isinstance(count, bool) and isinstance(count, int | float) and 0 <= count < math.inf


def limiter(
    calls: RetriedCalls, settings: Settings, step: int, lease: Lease | None = None
) -> Callable[..., Held] | None:
    """``take`` bound to one step's store calls, settings and lease (which renews the
    slots its calls hold); ``None`` if no limit is declared."""
    if not settings.limits:
        return None
    return functools.partial(
        take,
        calls,
        settings.declared_limits,
        ttl=settings.lease_ttl,
        wait=settings.limit_wait,
        step=step,
        pause_max=settings.backoff_max,
        lease=lease,
    )
