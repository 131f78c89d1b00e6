"""How long to wait before retrying a step: the provider's Retry-After, else backoff."""

from __future__ import annotations

import email.utils
import math
import random
import time
from collections.abc import Mapping
from typing import Any


def retry_after(exc: BaseException) -> float | None:
    """The delay a rate-limit error asks for, in seconds, or ``None`` if it names none.

    Reads ``retry-after-ms`` and ``Retry-After`` (seconds or an HTTP date) from the headers
    the error carries, as OpenAI, Anthropic and httpx errors do (``exc.response.headers``),
    or from ``exc.headers``; an explicit ``exc.retry_after`` (seconds) wins. The delay
    may be infinite: the caller caps it (at ``backoff_max``).
    """
    explicit = getattr(exc, "retry_after", None)
    if isinstance(explicit, (int, float)) and explicit >= 0:
        return float(explicit)
    headers = _headers(exc)
    if headers is None:
        return None
    millis = _header(headers, "retry-after-ms")
    if millis is not None and (seconds := _seconds(millis, per=1000)) is not None:
        return seconds
    value = _header(headers, "retry-after")
    if value is None:
        return None
    if (seconds := _seconds(value, per=1)) is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _seconds(value: str, *, per: float) -> float | None:
    """``value`` read as a number of ``1/per`` seconds (none below 0), or ``None`` if it
    is not one."""
    try:
        number = float(value)
    except ValueError:
        return None
    # float() reads "nan", which names no time at all: as malformed as "soon".
    return None if math.isnan(number) else max(0.0, number / per)


def _headers(exc: BaseException) -> Mapping[str, Any] | None:
    response = getattr(exc, "response", None)
    for source in (getattr(response, "headers", None), getattr(exc, "headers", None)):
        if isinstance(source, Mapping) or hasattr(source, "get"):
            return source
    return None


def _header(headers: Mapping[str, Any], name: str) -> str | None:
    value = headers.get(name)
    if value is None:  # a plain dict is case-sensitive; httpx.Headers is not
        value = next((v for k, v in headers.items() if str(k).lower() == name), None)
    return None if value is None else str(value)


def backoff(attempt: int, *, base: float, cap: float) -> float:
    """Exponential backoff with full jitter: uniform in [0, min(cap, base * 2**(attempt-1))]."""
    # Past 2**64 any base is beyond any cap; uncapped, 2**1024 overflows a float.
    return random.uniform(0, min(cap, base * 2 ** min(attempt - 1, 64)))


def retry_delay(exc: BaseException, attempt: int, *, base: float, cap: float) -> float:
    asked = retry_after(exc)
    return min(asked, cap) if asked is not None else backoff(attempt, base=base, cap=cap)
