"""The limit operations, the same on every backend: all-or-none takes, owned slots,
pauses that only lengthen."""

from __future__ import annotations

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
    assert store.take_limits(take, "a", 30) == 0
    assert store.take_limits(take, "b", 30) == 0
    waited = store.take_limits(take, "c", 30)
    assert 0.5 < waited <= 1.0  # one request a second refills


def test_tokens_are_spent_by_cost(store: Store) -> None:
    assert store.take_limits([Take("tokens", TOKENS, 500)], "a", 30) == 0
    # 100 tokens left of the minute; 200 more come in 20 s.
    waited = store.take_limits([Take("tokens", TOKENS, 200)], "b", 30)
    assert 9 < waited <= 10


def test_a_take_is_all_or_none(store: Store) -> None:
    assert store.take_limits([Take("slots", SLOTS, 0)], "a", 30) == 0
    assert store.take_limits([Take("slots", SLOTS, 0)], "b", 30) == 0
    assert store.take_limits([Take("rate", RATE, 0), Take("slots", SLOTS, 0)], "c", 30) > 0
    # The refused take spent none of the rate: its burst of two is whole.
    assert store.take_limits([Take("rate", RATE, 0)], "d", 30) == 0
    assert store.take_limits([Take("rate", RATE, 0)], "e", 30) == 0


def test_a_released_slot_is_free_again_and_only_its_holder_releases_it(store: Store) -> None:
    one = agentq.limit("one", concurrency=1)
    assert store.take_limits([Take("one", one, 0)], "a", 30) == 0
    store.release_limits(["one"], "someone-else")
    assert store.take_limits([Take("one", one, 0)], "b", 30) > 0
    store.release_limits(["one"], "a")
    assert store.take_limits([Take("one", one, 0)], "b", 30) == 0


def test_a_pause_refuses_takes_and_never_shortens(store: Store) -> None:
    store.pause_limit("rate", 30)
    store.pause_limit("rate", 1)
    assert store.take_limits([Take("rate", RATE, 0)], "a", 30) > 25


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


def test_bad_names_and_duplicates_are_refused() -> None:
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
    assert store.take_limits([Take("tokens", TOKENS, 500)], "a", 30) == 0
    assert store.take_limits([Take("tokens", TOKENS, 200)], "b", 30) > 9
    store.settle_limits([Take("tokens", TOKENS, -400)])  # the call used 100, not 500
    assert store.take_limits([Take("tokens", TOKENS, 200)], "b", 30) == 0
    store.settle_limits([Take("tokens", TOKENS, 300)])  # this one used 500, not 200
    # 100 + 500 of 600 spent: 300 more come in 30 s.
    assert 29 < store.take_limits([Take("tokens", TOKENS, 300)], "c", 30) <= 30


def test_a_refund_frees_no_more_than_a_full_budget_and_keys_without_tokens_are_left(
    store: Store,
) -> None:
    assert store.take_limits([Take("tokens", TOKENS, 100), Take("rate", RATE, 0)], "a", 30) == 0
    store.settle_limits([Take("tokens", TOKENS, -10_000), Take("rate", RATE, -10_000)])
    assert store.take_limits([Take("tokens", TOKENS, 600)], "b", 30) == 0
    assert store.take_limits([Take("tokens", TOKENS, 1)], "c", 30) > 0
    assert store.take_limits([Take("rate", RATE, 0)], "d", 30) == 0
    assert store.take_limits([Take("rate", RATE, 0)], "e", 30) > 0  # burst 2: one was used


def test_a_renewed_slot_outlives_its_first_ttl_and_a_released_one_stays_free(
    store: Store,
) -> None:
    two = agentq.limit("two", concurrency=2)
    assert store.take_limits([Take("two", two, 0)], "kept", 0.5) == 0
    assert store.take_limits([Take("two", two, 0)], "lapsed", 0.5) == 0
    store.renew_limits([Slot("two", "kept", 60)])
    wait_until(
        lambda: store.limit_states()["two"].in_flight == 1, timeout=10, what="a slot expiring"
    )
    assert store.take_limits([Take("two", two, 0)], "new", 30) == 0
    assert store.take_limits([Take("two", two, 0)], "more", 30) > 0  # "kept" still holds
    store.release_limits(["two"], "kept")
    store.renew_limits([Slot("two", "kept", 60), Slot("two", "lapsed", 60)])
    assert store.take_limits([Take("two", two, 0)], "more", 30) == 0


def test_the_store_counts_the_takes_it_granted_per_key(store: Store) -> None:
    assert store.limit_takes() == {}
    one = agentq.limit("one", concurrency=1)
    assert store.take_limits([Take("rate", RATE, 0), Take("one", one, 0)], "a", 30) == 0
    assert store.take_limits([Take("rate", RATE, 0)], "b", 30) == 0
    assert store.take_limits([Take("rate", RATE, 0), Take("one", one, 0)], "c", 30) > 0
    assert store.limit_takes() == {"rate": 2, "one": 1}
