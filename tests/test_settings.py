"""Settings refuse, when they are made, a value no worker could act on."""

from __future__ import annotations

import pytest

from agentq.errors import SettingsError
from agentq.settings import Settings


@pytest.mark.parametrize("ttl", [-1.0, float("nan")])
def test_a_finished_ttl_that_is_no_age_is_refused(ttl: float) -> None:
    """No thread's age compares with NaN; a negative one would act as 0 does, under a
    value that says something else."""
    with pytest.raises(SettingsError, match=r"finished_ttl \((-1.0|nan)\) must be seconds"):
        Settings(finished_ttl=ttl)


def test_finished_ttl_takes_0_and_inf() -> None:
    assert Settings(finished_ttl=0).finished_ttl == 0
    assert Settings(finished_ttl=float("inf")).finished_ttl == float("inf")
