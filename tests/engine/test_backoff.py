"""How long a step waits before it is retried: the provider's Retry-After, else backoff."""

from __future__ import annotations

import datetime as dt
import email.utils
import itertools
import random
import time
from types import SimpleNamespace

import pytest

from agentq.engine import backoff as backoff_module
from agentq.engine.backoff import backoff, retry_after, retry_delay


class RateLimited(Exception):
    """Shaped like OpenAI's and Anthropic's errors: the HTTP response rides on the error."""

    def __init__(self, headers: dict[str, str]) -> None:
        super().__init__("429 Too Many Requests")
        self.response = type("Response", (), {"headers": headers})()


class WithHeaders(Exception):
    def __init__(self, headers: dict[str, str]) -> None:
        super().__init__("429")
        self.headers = headers


@pytest.fixture
def seeded(monkeypatch: pytest.MonkeyPatch) -> random.Random:
    rng = random.Random(20240607)
    monkeypatch.setattr(backoff_module, "random", rng)
    return rng


@pytest.fixture
def top_of_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backoff draws its upper bound, so a delay that came from backoff is recognisable."""
    monkeypatch.setattr(backoff_module, "random", SimpleNamespace(uniform=lambda low, high: high))


# -- Retry-After -------------------------------------------------------------------------


def test_retry_after_in_seconds() -> None:
    assert retry_after(RateLimited({"retry-after": "7"})) == 7.0
    assert retry_after(RateLimited({"retry-after": "1.5"})) == 1.5


def test_retry_after_as_an_http_date_is_the_time_until_then() -> None:
    target = int(time.time()) + 30  # whole seconds: an HTTP date has no fractions
    header = email.utils.format_datetime(dt.datetime.fromtimestamp(target, dt.UTC), usegmt=True)
    before = time.time()
    delay = retry_after(RateLimited({"retry-after": header}))
    after = time.time()
    assert delay is not None
    assert target - after - 1e-6 <= delay <= target - before + 1e-6


def test_retry_after_date_in_the_past_means_now() -> None:
    header = email.utils.format_datetime(
        dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5), usegmt=True
    )
    assert retry_after(RateLimited({"retry-after": header})) == 0.0


def test_retry_after_ms_is_read_and_wins_over_retry_after() -> None:
    assert retry_after(RateLimited({"retry-after-ms": "250"})) == 0.25
    assert retry_after(RateLimited({"retry-after-ms": "1500", "retry-after": "9"})) == 1.5


def test_header_names_match_whatever_their_case() -> None:
    assert retry_after(RateLimited({"Retry-After": "4"})) == 4.0
    assert retry_after(RateLimited({"Retry-After-Ms": "40"})) == 0.04


def test_headers_are_found_on_the_error_itself() -> None:
    assert retry_after(WithHeaders({"retry-after": "3"})) == 3.0


def test_response_headers_are_read_before_the_errors_own() -> None:
    exc = RateLimited({"retry-after": "2"})
    exc.headers = {"retry-after": "99"}  # type: ignore[attr-defined]
    assert retry_after(exc) == 2.0


def test_an_explicit_retry_after_attribute_wins() -> None:
    exc = RateLimited({"retry-after": "60"})
    exc.retry_after = 0.5  # type: ignore[attr-defined]
    assert retry_after(exc) == 0.5


def test_no_headers_and_unrelated_errors_name_no_delay() -> None:
    assert retry_after(ValueError("boom")) is None
    assert retry_after(RateLimited({"content-type": "application/json"})) is None


@pytest.mark.parametrize("value", ["soon", "", "Thu, 99 Foo 2024 25:61:00 GMT", "12 s", "nan"])
def test_a_malformed_retry_after_falls_back_to_backoff(value: str, top_of_range: None) -> None:
    exc = RateLimited({"retry-after": value})
    assert retry_after(exc) is None
    assert retry_delay(exc, 3, base=0.5, cap=60) == 2.0  # 0.5 * 2**2: backoff's bound


def test_a_malformed_retry_after_ms_falls_back_to_retry_after() -> None:
    assert retry_after(RateLimited({"retry-after-ms": "n/a", "retry-after": "5"})) == 5.0
    assert retry_after(RateLimited({"retry-after-ms": "NaN", "retry-after": "5"})) == 5.0


def test_a_negative_delay_is_read_as_now() -> None:
    assert retry_after(RateLimited({"retry-after": "-3"})) == 0.0
    assert retry_after(RateLimited({"retry-after-ms": "-3"})) == 0.0


# -- retry_delay -----------------------------------------------------------------------------


def test_retry_delay_uses_the_asked_delay_but_never_beyond_the_cap(top_of_range: None) -> None:
    assert retry_delay(RateLimited({"retry-after": "7"}), 5, base=1, cap=60) == 7.0
    assert retry_delay(RateLimited({"retry-after": "3600"}), 1, base=1, cap=60) == 60.0
    assert retry_delay(RateLimited({"retry-after": "0"}), 5, base=1, cap=60) == 0.0


def test_retry_delay_without_a_header_is_backoff(top_of_range: None) -> None:
    assert retry_delay(ValueError(), 1, base=0.25, cap=60) == 0.25
    assert retry_delay(ValueError(), 4, base=0.25, cap=60) == 2.0


# -- backoff -------------------------------------------------------------------------------


def samples(attempt: int, *, base: float, cap: float, n: int = 2000) -> list[float]:
    return [backoff(attempt, base=base, cap=cap) for _ in range(n)]


def test_backoff_is_full_jitter_within_zero_and_the_bound(seeded: random.Random) -> None:
    for attempt in range(1, 8):
        bound = 0.5 * 2 ** (attempt - 1)
        drawn = samples(attempt, base=0.5, cap=1000)
        assert all(0 <= d <= bound for d in drawn)
        # Full jitter: spread over the whole range, not bunched near the bound.
        assert min(drawn) < 0.05 * bound and max(drawn) > 0.95 * bound


def test_backoffs_upper_bound_doubles_with_each_attempt(seeded: random.Random) -> None:
    highest = [max(samples(attempt, base=1, cap=1000)) for attempt in range(1, 7)]
    for earlier, later in itertools.pairwise(highest):
        assert later > 1.5 * earlier


def test_backoff_never_exceeds_the_cap(seeded: random.Random) -> None:
    drawn = [d for attempt in range(1, 40) for d in samples(attempt, base=1, cap=5, n=200)]
    assert all(0 <= d <= 5 for d in drawn)
    assert max(drawn) > 4.9


def test_backoff_stays_at_the_cap_however_many_attempts(seeded: random.Random) -> None:
    drawn = [d for attempt in (1025, 10_000) for d in samples(attempt, base=1, cap=5, n=50)]
    assert all(0 <= d <= 5 for d in drawn)
