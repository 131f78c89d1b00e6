"""Which Redis errors mean "not now" rather than "no": worth the same call again soon."""

from __future__ import annotations

import redis
from redis.exceptions import ClusterError, ReadOnlyError, ResponseError, TryAgainError

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    # Covers a pool with no free connection in time, a reset, and LOADING after a restart.
    redis.ConnectionError,
    redis.TimeoutError,
    # A replica promoted or demoted under us, a resharding slot, CLUSTERDOWN, MASTERDOWN.
    ReadOnlyError,
    TryAgainError,
    ClusterError,
)


def is_transient(exc: BaseException) -> bool:
    # redis-py has no class for BUSY: another client's script is still running.
    return isinstance(exc, TRANSIENT_ERRORS) or (
        isinstance(exc, ResponseError) and str(exc).startswith("BUSY ")
    )
