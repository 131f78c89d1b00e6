"""Which errors a step is retried on: ``AgentTask.retry_on``, nothing by default."""

from __future__ import annotations

from typing import Any

import pytest

from agentq.celery.task import AgentTask


class Transient(Exception):
    pass


class Flaky(AgentTask):
    name = "tests.backoff.flaky"
    retry_on = (Transient, TimeoutError)


class Plain(AgentTask):
    name = "tests.backoff.plain"


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (Transient(), True),
        (TimeoutError(), True),
        (type("Sub", (Transient,), {})(), True),
        (ValueError(), False),
        (RuntimeError(), False),
    ],
)
def test_should_retry_is_an_isinstance_check_against_retry_on(exc: Any, expected: bool) -> None:
    assert Flaky().should_retry(exc) is expected


def test_should_retry_retries_nothing_by_default() -> None:
    assert not Plain().should_retry(TimeoutError())
    assert not Plain().should_retry(Exception())
