"""Taking limits in place: waiters on the rate queue behind each other once, not poll."""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agentq
from agentq.engine.limits import Held, take
from agentq.engine.store_retry import RetriedCalls
from agentq.errors import LimitError
from agentq.limits import Limits
from agentq.outcomes import LimitWait
from agentq.store.contract import Store
from agentq.store.contract.limits import Grant, Take
from agentq.store.redis.store import RedisStore
from agentq.store.sqlite.store import SQLiteStore
from tests.support.redis_server import RedisServer


def _calls(store: Store, thread_id: str) -> RetriedCalls:
    return RetriedCalls(store, thread_id, lease_ttl=30)


@pytest.fixture(params=["redis", "sqlite"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    made: Store
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        made = RedisStore.from_url(server.url, prefix=f"lim{uuid.uuid4().hex[:8]}:")
    else:
        made = SQLiteStore(tmp_path / "agentq.db")
    with made:
        yield made


class CountingStore(SQLiteStore):
    """The embedded store, counting the takes asked of it."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.asked = 0
        self._lock = threading.Lock()

    def take_limits(self, takes: list[Take], holder: str, ttl: float, *args: Any) -> Grant:
        with self._lock:
            self.asked += 1
        return super().take_limits(takes, holder, ttl, *args)


def test_callers_waiting_on_the_rate_each_take_once_and_queue_behind_each_other(
    tmp_path: Path,
) -> None:
    limits = Limits([agentq.limit("api", requests_per_minute=600, burst=1)])
    with CountingStore(tmp_path / "agentq.db") as store:
        held: list[Held] = []

        def call(i: int) -> None:
            held.append(
                take(
                    _calls(store, f"t{i}"), limits, "api", 0, ttl=30, wait=5, step=0, pause_max=300
                )
            )

        callers = [threading.Thread(target=call, args=(i,)) for i in range(5)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join()
        assert store.asked == 5  # one take each: the four behind the first were reserved
        waits = sorted(h.waited for h in held)
        assert waits[0] == 0
        assert waits[-1] <= 0.4 + 1e-6, waits  # the last of five, four intervals of 0.1 s


class StoreDownAtRelease(SQLiteStore):
    """The embedded store, unable to answer when the slots are given back."""

    def release_limits(self, keys: list[str], holder: str) -> None:
        raise sqlite3.OperationalError("database is locked")


def test_a_slot_the_store_cannot_take_back_now_frees_itself_within_its_ttl(
    tmp_path: Path,
) -> None:
    """The call has run by the time its slot is given back: a store error there must not
    replace the call's result, and the slot, no longer renewed, frees itself."""
    limits = Limits([agentq.limit("gpu", concurrency=1)])
    with StoreDownAtRelease(tmp_path / "agentq.db") as store:
        held = take(_calls(store, "t1"), limits, "gpu", 0, ttl=0.3, wait=0, step=0, pause_max=300)
        held.release()  # logged, not raised
        again = take(_calls(store, "t2"), limits, "gpu", 0, ttl=0.3, wait=5, step=0, pause_max=300)
        assert 0 < again.waited <= 5


class StoreRefusingRelease(SQLiteStore):
    """The embedded store, refusing every write when the slots are given back."""

    def release_limits(self, keys: list[str], holder: str) -> None:
        read_only = sqlite3.connect(self.path)
        try:
            read_only.execute("PRAGMA query_only=ON")
            read_only.execute("DELETE FROM threads")
        finally:
            read_only.close()


def test_a_store_error_that_will_not_pass_is_raised_at_release(tmp_path: Path) -> None:
    limits = Limits([agentq.limit("gpu", concurrency=1)])
    with StoreRefusingRelease(tmp_path / "agentq.db") as store:
        held = take(_calls(store, "t1"), limits, "gpu", 0, ttl=30, wait=0, step=0, pause_max=300)
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            held.release()


class LockedAtFirstTake(SQLiteStore):
    """The embedded store, locked by another process at the first take."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.refused = 0

    def take_limits(self, takes: list[Take], holder: str, ttl: float, *args: Any) -> Grant:
        if not self.refused:
            self.refused += 1
            raise sqlite3.OperationalError("database is locked")
        return super().take_limits(takes, holder, ttl, *args)


def test_a_take_the_store_refuses_for_a_moment_is_tried_again(tmp_path: Path) -> None:
    limits = Limits([agentq.limit("gpu", concurrency=1)])
    with LockedAtFirstTake(tmp_path / "agentq.db") as store:
        held = take(_calls(store, "t1"), limits, "gpu", 0, ttl=30, wait=0, step=0, pause_max=300)
        assert store.refused == 1
        assert held.keys == ("gpu",)
        held.release()


class LockedAtSettle(SQLiteStore):
    """The embedded store, locked by another process when a call's tokens are settled."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.settles = 0

    def settle_limits(self, takes: list[Take]) -> None:
        self.settles += 1
        raise sqlite3.OperationalError("database is locked")


def test_a_settle_the_store_refuses_is_logged_and_never_sent_twice(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A difference is charged as sent: sent again after a reply that was lost, it would
    be charged twice. The call has run, so the estimate stands rather than its result
    being lost."""
    limits = Limits([agentq.limit("tokens", tokens_per_minute=10_000)])
    caplog.set_level(logging.WARNING, logger="agentq")
    with LockedAtSettle(tmp_path / "agentq.db") as store:
        held = take(
            _calls(store, "t1"), limits, "tokens", 100, ttl=30, wait=0, step=0, pause_max=300
        )
        held.settle(lambda result: result["used"], {"used": 40})
        assert store.settles == 1
        assert "could not settle the tokens of tokens" in caplog.text


def test_a_key_still_holding_its_familys_placeholder_is_refused_and_takes_nothing(
    tmp_path: Path,
) -> None:
    """``limit="tenant:{tenant_id}"`` (an f-string forgotten) matches its family's own
    pattern: taken, it would be one budget every tenant shares."""
    limits = Limits([agentq.limit("tenant:{tenant_id}", requests_per_minute=60)])
    with SQLiteStore(tmp_path / "agentq.db") as store:
        with pytest.raises(LimitError, match=r"thread t1 step 3: .*still holds a \{placeholder"):
            take(
                _calls(store, "t1"),
                limits,
                "tenant:{tenant_id}",
                0,
                ttl=30,
                wait=0,
                step=3,
                pause_max=300,
            )
        assert store.limit_takes() == {}
        assert take(
            _calls(store, "t1"), limits, "tenant:acme", 0, ttl=30, wait=0, step=3, pause_max=300
        ).keys


@pytest.mark.parametrize(
    ("names", "cost", "words"),
    [
        ((), 0, r"limit=\(\) names no limit key"),
        ([], 0, r"limit=\[\] names no limit key"),
        ("api", "100", "cost='100' is not a token count"),
        ("api", None, "cost=None is not a token count"),
        ("api", True, "cost=True is not a token count"),
        ("api", math.nan, "cost=nan is not a token count"),
        ("api", math.inf, "cost=inf is not a token count"),
    ],
)
def test_a_call_naming_no_key_or_no_token_count_is_refused_and_takes_nothing(
    tmp_path: Path, names: Any, cost: Any, words: str
) -> None:
    """Refused before the take: ``limit=[]`` would hold nothing for ``actual_cost`` to
    settle, after the tool ran, and a NaN or infinite cost would be stored as the time the
    budget is next free, breaking it for the fleet."""
    limits = Limits([agentq.limit("api", requests_per_minute=600, tokens_per_minute=60_000)])
    with SQLiteStore(tmp_path / "agentq.db") as store:
        with pytest.raises(LimitError, match=f"thread t1 step 2: {words}"):
            take(_calls(store, "t1"), limits, names, cost, ttl=30, wait=0, step=2, pause_max=300)
        assert store.limit_takes() == {}


def test_an_infinite_actual_cost_is_refused_and_the_budget_left_whole(tmp_path: Path) -> None:
    """Charged, an infinite usage would be stored as the time the budget is next free,
    and every later take of the key would wait for it forever."""
    limits = Limits([agentq.limit("tokens", tokens_per_minute=60_000)])
    with SQLiteStore(tmp_path / "agentq.db") as store:
        held = take(
            _calls(store, "t1"), limits, "tokens", 10, ttl=30, wait=0, step=4, pause_max=300
        )
        with pytest.raises(LimitError, match="step 4: actual_cost returned inf; it must"):
            held.settle(lambda result: math.inf, None)
        assert take(
            _calls(store, "t2"), limits, "tokens", 50_000, ttl=30, wait=0, step=0, pause_max=300
        ).keys


class Refused(Exception):
    """A provider's refusal naming how long to wait, as ``exc.retry_after`` does."""

    def __init__(self, retry_after: float) -> None:
        super().__init__("429 Too Many Requests")
        self.retry_after = retry_after


@pytest.mark.parametrize("asked", [math.inf, 1e300], ids=["inf", "absurd"])
def test_a_refusal_asking_for_no_end_pauses_the_key_for_backoff_max_at_most(
    any_store: Store, asked: float
) -> None:
    """As the step's own retry is capped: an infinite Retry-After paused the key for
    good on SQLite, and on Redis could not be sent (or, absurd, read back) at all."""
    limits = Limits([agentq.limit("api", requests_per_minute=600)])
    held = take(_calls(any_store, "t1"), limits, "api", 0, ttl=30, wait=0, step=0, pause_max=5)
    held.refused(Refused(asked))
    state = any_store.limit_states()["api"]
    assert 4 < state.paused - state.now <= 5
    with pytest.raises(LimitWait) as waiting:
        take(_calls(any_store, "t2"), limits, "api", 0, ttl=30, wait=0, step=0, pause_max=5)
    assert 4 < waiting.value.seconds <= 5 * 1.1


def test_a_call_reserved_before_a_refusal_paused_its_key_waits_out_the_pause(
    any_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call queued behind another on the rate is reserved, and starts its interval
    later; the call ahead being refused with Retry-After meanwhile pauses the key for the
    fleet, and the reserved call must honour that pause rather than be sent into it."""
    limits = Limits([agentq.limit("api", requests_per_minute=600, burst=1, concurrency=5)])
    first = take(_calls(any_store, "t1"), limits, "api", 0, ttl=30, wait=0, step=0, pause_max=60)
    reserve = any_store.take_limits

    def reserved_then_refused(takes: list[Take], holder: str, ttl: float, *args: Any) -> Grant:
        granted = reserve(takes, holder, ttl, *args)
        assert granted.taken and granted.wait > 0  # queued one interval behind the first
        first.refused(Refused(30))  # the call ahead meets a 429 while this one waits
        return granted

    monkeypatch.setattr(any_store, "take_limits", reserved_then_refused)
    with pytest.raises(LimitWait) as waiting:
        take(_calls(any_store, "t2"), limits, "api", 0, ttl=30, wait=5, step=0, pause_max=60)
    assert 25 < waiting.value.seconds <= 30 * 1.1
    monkeypatch.undo()
    assert any_store.limit_states()["api"].in_flight == 1  # the reserved call's slot is back
