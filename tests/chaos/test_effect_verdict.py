"""The chaos run's verdict on an email sent twice: the known limit only for one late call
under a lease a SIGSTOP froze, beside a call with a newer token; any other is a duplicate."""

from __future__ import annotations

from tests.support.agents import Arrival
from tests.support.chaos import frozen_calls

FROZEN, OTHER = 4100, 4200


def test_the_frozen_workers_call_beside_a_newer_one_is_the_known_limit() -> None:
    late = Arrival(4, FROZEN)
    assert frozen_calls([Arrival(5, OTHER), late], {late}) == [late]
    # Woken before the new driver's call left, the frozen worker's call arrives first.
    assert frozen_calls([late, Arrival(5, OTHER)], {late}) == [late]


def test_a_call_under_a_lease_that_was_not_frozen_is_a_duplicate() -> None:
    assert frozen_calls([Arrival(5, OTHER), Arrival(4, FROZEN)], set()) == []
    # The same worker, under a token it did not hold when frozen.
    assert frozen_calls([Arrival(5, OTHER), Arrival(3, FROZEN)], {Arrival(4, FROZEN)}) == []


def test_a_frozen_lease_excuses_one_call_only() -> None:
    late = Arrival(4, FROZEN)
    assert frozen_calls([Arrival(5, OTHER), late, late], {late}) == [late]


def test_no_newer_token_means_a_duplicate() -> None:
    late = Arrival(4, FROZEN)
    assert frozen_calls([late, late], {late}) == []
    assert frozen_calls([Arrival(5, FROZEN), Arrival(5, OTHER)], {Arrival(5, FROZEN)}) == []
