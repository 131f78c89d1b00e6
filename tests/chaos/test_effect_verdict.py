"""The chaos run's verdict on an email sent twice: the known limit only when the late one
came from a worker the run froze, with an older fencing token than one already sent."""

from __future__ import annotations

from tests.support.agents import Arrival
from tests.support.chaos import frozen_late_calls

FROZEN, OTHER = 4100, 4200


def test_a_frozen_workers_late_call_with_an_older_token_is_the_known_limit() -> None:
    assert frozen_late_calls([Arrival(5, OTHER), Arrival(4, FROZEN)], {FROZEN}) == 1


def test_a_late_call_from_a_worker_never_frozen_is_a_duplicate() -> None:
    assert frozen_late_calls([Arrival(5, OTHER), Arrival(4, FROZEN)], set()) == 0


def test_a_second_call_with_the_same_or_a_newer_token_is_a_duplicate() -> None:
    assert frozen_late_calls([Arrival(4, FROZEN), Arrival(4, FROZEN)], {FROZEN}) == 0
    assert frozen_late_calls([Arrival(4, FROZEN), Arrival(5, OTHER)], {FROZEN}) == 0
