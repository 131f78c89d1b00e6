"""The limit operations, the same on every backend: all-or-none takes, owned slots,
pauses that only lengthen."""

from __future__ import annotations

import math
from typing import Any

import pytest

import agentq
from agentq.errors import LimitError
from agentq.limits import Limits
from agentq.settings import Settings
from agentq.store.contract import Store
from agentq.store.contract.limits import Slot, Take
from tests.support.redis_server import wait_until

RATE = agentq.limit("rate", requests_per_minute=60, burst=2)
TOKENS = agentq.limit("tokens", tokens_per_minute=600)
SLOTS = agentq.limit("slots", concurrency=2)


def test_a_rate_grants_its_burst_then_names_the_wait(store: Store) -> None:
    take = [Take("rate", RATE, 0)]
    assert store.take_limits(take, "a", 30).taken
    assert store.take_limits(take, "b", 30).taken
    waited = store.take_limits(take, "c", 30).wait
    assert 0.5 < waited <= 1.0  # one request a second refills


def test_tokens_are_spent_by_cost(store: Store) -> None:
    assert store.take_limits([Take("tokens", TOKENS, 500)], "a", 30).taken
    # 100 tokens left of the minute; 200 more come in 20 s.
    waited = store.take_limits([Take("tokens", TOKENS, 200)], "b", 30).wait
    assert 9 < waited <= 10


def test_a_take_is_all_or_none(store: Store) -> None:
    assert store.take_limits([Take("slots", SLOTS, 0)], "a", 30).taken
    assert store.take_limits([Take("slots", SLOTS, 0)], "b", 30).taken
    assert store.take_limits([Take("rate", RATE, 0), Take("slots", SLOTS, 0)], "c", 30).wait > 0
    # The refused take spent none of the rate: its burst of two is whole.
    assert store.take_limits([Take("rate", RATE, 0)], "d", 30).taken
    assert store.take_limits([Take("rate", RATE, 0)], "e", 30).taken


def test_a_released_slot_is_free_again_and_only_its_holder_releases_it(store: Store) -> None:
    one = agentq.limit("one", concurrency=1)
    assert store.take_limits([Take("one", one, 0)], "a", 30).taken
    store.release_limits(["one"], "someone-else")
    assert store.take_limits([Take("one", one, 0)], "b", 30).wait > 0
    store.release_limits(["one"], "a")
    assert store.take_limits([Take("one", one, 0)], "b", 30).taken


def test_a_pause_refuses_takes_and_never_shortens(store: Store) -> None:
    store.pause_limit("rate", 30)
    store.pause_limit("rate", 1)
    assert store.take_limits([Take("rate", RATE, 0)], "a", 30).wait > 25


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({}, "sets no budget"),
        ({"requests_per_minute": 0}, "must be positive"),
        ({"concurrency": 2, "burst": 3}, "burst needs requests_per_minute"),
    ],
)
def test_bad_declarations_are_refused(kwargs: dict[str, float], words: str) -> None:
    with pytest.raises(LimitError, match=words):
        agentq.limit("api", **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"requests_per_minute": "60"}, "requests_per_minute must be positive, a finite"),
        ({"tokens_per_minute": "1000"}, "tokens_per_minute must be positive, a finite"),
        ({"requests_per_minute": 60, "burst": "5"}, "burst must be positive, a finite"),
        ({"requests_per_minute": math.inf}, "leave it out for no budget"),
        ({"tokens_per_minute": True}, "tokens_per_minute must be positive, a finite"),
        ({"concurrency": "3"}, "concurrency must be a whole number of at least 1, got '3'"),
        ({"concurrency": 1.5}, "concurrency must be a whole number of at least 1, got 1.5"),
        ({"concurrency": True}, "concurrency must be a whole number of at least 1, got True"),
    ],
)
def test_a_budget_that_is_no_number_a_fraction_of_a_call_or_infinite_is_refused(
    kwargs: dict[str, Any], words: str
) -> None:
    """Refused as the declarations are read, not as a TypeError at the first call (or
    never: ``concurrency=1.5`` let two calls in at once)."""
    with pytest.raises(LimitError, match=words):
        agentq.limit("api", **kwargs)


def test_bad_names_and_duplicates_are_refused() -> None:
    with pytest.raises(LimitError, match="rename it"):
        agentq.limit(7, concurrency=1)  # type: ignore[arg-type]

    with pytest.raises(LimitError, match="rename it"):
        agentq.limit("has space", concurrency=1)
    with pytest.raises(LimitError, match="declared twice"):
        Settings(limits=(RATE, agentq.limit("rate", concurrency=1)))
    with pytest.raises(LimitError, match=r"agentq\.limit"):
        Limits(["rate"])  # type: ignore[list-item]


def test_a_family_gives_each_key_its_budget_and_a_named_key_overrides_it() -> None:
    family = agentq.limit("tenant:{tenant_id}", requests_per_minute=60)
    vip = agentq.limit("tenant:42", requests_per_minute=600)
    limits = Limits([family, vip])
    assert limits.of("tenant:7") is family
    assert limits.of("tenant:42") is vip
    with pytest.raises(LimitError, match="no limit is declared for 'tenant:7:x'"):
        limits.of("tenant:7:x")


def test_settling_refunds_or_charges_the_difference_in_tokens(store: Store) -> None:
    assert store.take_limits([Take("tokens", TOKENS, 500)], "a", 30).taken
    assert store.take_limits([Take("tokens", TOKENS, 200)], "b", 30).wait > 9
    store.settle_limits([Take("tokens", TOKENS, -400)])  # the call used 100, not 500
    assert store.take_limits([Take("tokens", TOKENS, 200)], "b", 30).taken
    store.settle_limits([Take("tokens", TOKENS, 300)])  # this one used 500, not 200
    # 100 + 500 of 600 spent: 300 more come in 30 s.
    assert 29 < store.take_limits([Take("tokens", TOKENS, 300)], "c", 30).wait <= 30


def test_a_refund_frees_no_more_than_a_full_budget_and_keys_without_tokens_are_left(
    store: Store,
) -> None:
    assert store.take_limits([Take("tokens", TOKENS, 100), Take("rate", RATE, 0)], "a", 30).taken
    store.settle_limits([Take("tokens", TOKENS, -10_000), Take("rate", RATE, -10_000)])
    assert store.take_limits([Take("tokens", TOKENS, 600)], "b", 30).taken
    assert store.take_limits([Take("tokens", TOKENS, 1)], "c", 30).wait > 0
    assert store.take_limits([Take("rate", RATE, 0)], "d", 30).taken
    assert store.take_limits([Take("rate", RATE, 0)], "e", 30).wait > 0  # burst 2: one was used


def test_a_renewed_slot_outlives_its_first_ttl_and_a_released_one_stays_free(
    store: Store,
) -> None:
    two = agentq.limit("two", concurrency=2)
    assert store.take_limits([Take("two", two, 0)], "kept", 0.5).taken
    assert store.take_limits([Take("two", two, 0)], "lapsed", 0.5).taken
    store.renew_limits([Slot("two", "kept", 60)])
    wait_until(
        lambda: store.limit_states()["two"].in_flight == 1, timeout=10, what="a slot expiring"
    )
    assert store.take_limits([Take("two", two, 0)], "new", 30).taken
    assert store.take_limits([Take("two", two, 0)], "more", 30).wait > 0  # "kept" still holds
    store.release_limits(["two"], "kept")
    store.renew_limits([Slot("two", "kept", 60), Slot("two", "lapsed", 60)])
    assert store.take_limits([Take("two", two, 0)], "more", 30).taken


def test_the_store_counts_the_takes_it_granted_per_key(store: Store) -> None:
    assert store.limit_takes() == {}
    one = agentq.limit("one", concurrency=1)
    assert store.take_limits([Take("rate", RATE, 0), Take("one", one, 0)], "a", 30).taken
    assert store.take_limits([Take("rate", RATE, 0)], "b", 30).taken
    assert store.take_limits([Take("rate", RATE, 0), Take("one", one, 0)], "c", 30).wait > 0
    assert store.limit_takes() == {"rate": 2, "one": 1}


def test_a_wait_on_the_rate_within_the_allowance_is_reserved_in_queue_order(
    store: Store,
) -> None:
    queued = agentq.limit("queued", requests_per_minute=60, burst=2, concurrency=5)
    take = [Take("queued", queued, 0)]
    assert store.take_limits(take, "a", 30, reserve_within=10) == (True, 0)
    assert store.take_limits(take, "b", 30, reserve_within=10) == (True, 0)
    # Past the burst, each reservation queues one interval (1 s) behind the last.
    first = store.take_limits(take, "c", 30, reserve_within=10)
    second = store.take_limits(take, "d", 30, reserve_within=10)
    assert first.taken and 0.5 < first.wait <= 1.0
    assert second.taken and 1.5 < second.wait <= 2.0
    assert store.limit_takes() == {"queued": 4}
    assert store.limit_states()["queued"].in_flight == 4  # reserved calls hold their slots
    # The third is three intervals away, beyond an allowance of 1 s: nothing is committed,
    # so the next take meets the same wait, not one more interval.
    beyond = store.take_limits(take, "e", 30, reserve_within=1)
    again = store.take_limits(take, "f", 30)
    assert not beyond.taken and 2.5 < beyond.wait <= 3.0
    assert not again.taken and 2.5 < again.wait <= beyond.wait
    assert store.limit_takes() == {"queued": 4}


def test_a_wait_on_tokens_is_reserved_by_cost(store: Store) -> None:
    assert store.take_limits([Take("tokens", TOKENS, 500)], "a", 30).taken
    # 100 tokens left of the minute; 200 more come in 20 s, then 100 more in 10.
    reserved = store.take_limits([Take("tokens", TOKENS, 200)], "b", 30, reserve_within=30)
    assert reserved.taken and 9 < reserved.wait <= 10
    after = store.take_limits([Take("tokens", TOKENS, 100)], "c", 30, reserve_within=5)
    assert not after.taken and 19 < after.wait <= 20


def test_a_pause_or_a_full_cap_is_never_reserved(store: Store) -> None:
    store.pause_limit("rate", 0.5)
    paused = store.take_limits([Take("rate", RATE, 0)], "a", 30, reserve_within=10)
    assert not paused.taken and 0 < paused.wait <= 0.5
    assert store.take_limits([Take("slots", SLOTS, 0)], "b", 30).taken
    assert store.take_limits([Take("slots", SLOTS, 0)], "c", 30).taken
    full = store.take_limits([Take("slots", SLOTS, 0)], "d", 30, reserve_within=10)
    assert not full.taken and full.wait > 0
    assert store.limit_takes() == {"slots": 2}
    assert store.limit_states()["slots"].in_flight == 2


def test_a_rate_under_one_request_a_minute_lets_its_first_call_go_at_once(store: Store) -> None:
    """One request every two minutes: half a request was the burst, less than any call
    costs, so every take found itself 60 s short and a call never went at all."""
    slow = agentq.limit("slow", requests_per_minute=0.5)
    take = [Take("slow", slow, 0)]
    assert store.take_limits(take, "a", 30) == (True, 0)
    assert 119 < store.take_limits(take, "b", 30).wait <= 120


def test_a_burst_under_one_request_is_refused() -> None:
    """Less than one request at once lets no request go but by a reservation, and a wait
    longer than limit_wait is never reserved: every call would wait for good."""
    with pytest.raises(LimitError, match="burst must be at least 1 request"):
        agentq.limit("api", requests_per_minute=6, burst=0.5)


def test_the_pause_of_keys_reads_the_longest_and_none_is_zero(store: Store) -> None:
    assert store.limit_paused(["rate", "never-seen"]) == 0
    store.pause_limit("rate", 30)
    store.pause_limit("tokens", 10)
    assert 29 < store.limit_paused(["tokens", "rate", "never-seen"]) <= 30
    assert 9 < store.limit_paused(["tokens"]) <= 10
