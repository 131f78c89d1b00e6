"""Fleet-wide rate limits: what ``agentq.limit`` declares and tool calls take from.

A declaration is pure data, given to ``init_app(app, limits=[...])`` (or
``app.conf.agentq_limits``), so every worker and the command line loading the app see the
same budgets. The store keeps what is used of them, on its own clock.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from agentq.errors import LimitError

_NAME: Final = re.compile(r"[A-Za-z0-9_.:\-]{1,200}")
_FAMILY: Final = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}")


@dataclass(frozen=True)
class Limit:
    """One key's budget: ``requests_per_minute`` (each call costs one), ``tokens_per_minute``
    (each call costs its ``cost=``), ``concurrency`` (calls in flight at once), ``threads``
    (threads sent with this concurrency key running at once, see
    ``AgentTask.concurrency_key``). A name with
    a ``{placeholder}`` (``"tenant:{tenant_id}"``) is a family: every key it matches gets
    its own budget of this size, unless a key is declared by its own name.

    A minute's budget may be spent at once, then refills evenly, as providers' limits do;
    ``burst`` (in requests, at least 1) caps how much of the request budget goes at once.
    A rate under one request a minute still lets one go at once."""

    name: str
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    concurrency: int | None = None
    burst: float | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(_FAMILY.sub("x", self.name)):
            raise LimitError(
                f"limit name {self.name!r} must be 1-200 letters, digits or _.:- (with "
                "{placeholders} for a family); rename it"
            )
        budgets = (self.requests_per_minute, self.tokens_per_minute, self.concurrency)
        if (*budgets, self.threads) == (None,) * 4:
            raise LimitError(
                f"limit {self.name!r} sets no budget; give requests_per_minute, "
                "tokens_per_minute, concurrency or threads"
            )
        # A fraction of a thread or a call would round to a cap nobody declared (1.5 lets
        # two in at once).
        for field in ("concurrency", "threads"):
            value = getattr(self, field)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise LimitError(
                    f"limit {self.name!r}: {field} must be a whole number of at least 1, got "
                    f"{value!r}"
                )
        for field in ("requests_per_minute", "tokens_per_minute", "burst"):
            value = getattr(self, field)
            # An infinite budget is no budget, which leaving the field out says plainly.
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0 < value < math.inf
            ):
                raise LimitError(
                    f"limit {self.name!r}: {field} must be positive, a finite int or float, "
                    f"got {value!r}; leave it out for no budget"
                )
        if self.burst is not None and self.requests_per_minute is None:
            raise LimitError(f"limit {self.name!r}: burst needs requests_per_minute")
        # A call costs one whole request: under one at once, a take conforms only as a
        # reservation, and one longer than limit_wait is never made, so no call would go.
        if self.burst is not None and self.burst < 1:
            raise LimitError(
                f"limit {self.name!r}: burst must be at least 1 request, got {self.burst!r}"
            )

    @property
    def request_burst(self) -> float:
        """How many requests may go at once: ``burst``, else a minute's worth, and at
        least the one a call costs (a rate under one a minute would otherwise never let
        a call go). 0 without ``requests_per_minute``."""
        if self.requests_per_minute is None:
            return 0.0
        if self.burst is not None:
            return self.burst
        return max(self.requests_per_minute, 1.0)

    @property
    def is_family(self) -> bool:
        return bool(_FAMILY.search(self.name))

    def matches(self, key: str) -> bool:
        return re.fullmatch(_pattern(self.name), key) is not None


def _pattern(name: str) -> str:
    out, last = [], 0
    for found in _FAMILY.finditer(name):
        out += [re.escape(name[last : found.start()]), "[^:]+"]
        last = found.end()
    out.append(re.escape(name[last:]))
    return "".join(out)


def limit(
    name: str,
    *,
    requests_per_minute: float | None = None,
    tokens_per_minute: float | None = None,
    concurrency: int | None = None,
    burst: float | None = None,
    threads: int | None = None,
) -> Limit:
    """Declare a budget; pass it to ``init_app(app, limits=[...])``. See :class:`Limit`."""
    return Limit(name, requests_per_minute, tokens_per_minute, concurrency, burst, threads)


class Limits:
    """The declared budgets of an app, looked up by the key a call names."""

    def __init__(self, declared: Iterable[Limit] = ()) -> None:
        self._exact: dict[str, Limit] = {}
        self._families: list[Limit] = []
        for each in declared:
            if not isinstance(each, Limit):
                raise LimitError(f"limits holds {each!r}; declare each one with agentq.limit(...)")
            if each.name in self._exact or any(f.name == each.name for f in self._families):
                raise LimitError(f"limit {each.name!r} is declared twice; keep one")
            if each.is_family:
                self._families.append(each)
            else:
                self._exact[each.name] = each

    def __bool__(self) -> bool:
        return bool(self._exact or self._families)

    def declared(self) -> Mapping[str, Limit]:
        return {**{f.name: f for f in self._families}, **self._exact}

    def of(self, key: str) -> Limit:
        """The budget of ``key``: its own declaration, else the first family matching it."""
        found = self._exact.get(key) or next((f for f in self._families if f.matches(key)), None)
        if found is None:
            raise LimitError(
                f"no limit is declared for {key!r}; add agentq.limit({key!r}, ...) to "
                "init_app(app, limits=[...]) or fix the name"
            )
        return found

    def for_call(self, key: str) -> Limit:
        """The budget a tool call's ``limit=`` key takes from, as :meth:`of`. Refuses a key
        that is no string, or that still holds a family's ``{placeholder}``, as
        :class:`~agentq.errors.LimitError`."""
        if not isinstance(key, str):
            raise LimitError(
                f"limit key {key!r} is not a string; name a declared limit, e.g. 'openai'"
            )
        if _FAMILY.search(key):
            # The family's pattern matches its own name: taken as a key, every call of
            # every tenant would share this one budget.
            raise LimitError(
                f"limit key {key!r} still holds a {{placeholder}}; format it with the "
                f"call's value (an f-string: f{key!r}), so that each key has its own budget"
            )
        return self.of(key)

    def thread_cap(self, key: str) -> int:
        """How many threads of concurrency key ``key`` may run at once: the ``threads`` of
        its declaration. Refuses a key nothing declares, or whose declaration has no
        ``threads``, as :class:`~agentq.errors.LimitError`."""
        if not isinstance(key, str) or not _NAME.fullmatch(key):
            raise LimitError(
                f"concurrency key {key!r} must be 1-200 letters, digits or _.:- (a key of a "
                "declared limit, e.g. 'tenant:42' for agentq.limit('tenant:{tenant_id}', ...))"
            )
        found = self.of(key)
        if found.threads is None:
            raise LimitError(
                f"limit {found.name!r} caps no threads, so it cannot be the concurrency key "
                f"{key!r}; add threads=N to agentq.limit({found.name!r}, ...)"
            )
        return found.threads
