"""Status predicates: every status is live, idle, or done, and exactly one of them."""

from __future__ import annotations

import pytest

from agentq.records import Status


@pytest.mark.parametrize("status", list(Status))
def test_each_status_is_live_idle_or_done(status: Status) -> None:
    kinds = [status.is_live, status.is_idle, status == Status.DONE]
    assert kinds.count(True) == 1, f"{status} is {kinds}"


def test_the_predicates_match_the_statuses_they_name() -> None:
    assert {s for s in Status if s.is_live} == {Status.QUEUED, Status.RUNNING, Status.RETRYING}
    assert {s for s in Status if s.finished} == {Status.DONE, Status.FAILED, Status.CANCELLED}
    assert Status.WAITING.is_idle and Status.NEEDS_ATTENTION.is_idle
