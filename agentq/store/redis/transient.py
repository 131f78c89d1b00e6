"""Which Redis errors mean "not now" rather than "no": worth the same call again soon."""

from __future__ import annotations

import ssl

import redis
from redis.exceptions import (
    AuthenticationError,
    ClusterError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    # Covers a pool with no free connection in time, a reset, and LOADING after a restart.
    redis.ConnectionError,
    redis.TimeoutError,
    # A replica promoted or demoted under us, a resharding slot, CLUSTERDOWN, MASTERDOWN.
    ReadOnlyError,
    TryAgainError,
    ClusterError,
)


_PASSING_REPLIES = ("BUSY ", "MISCONF ")
"""Refusals redis-py has no class for: another client's script still running; writes
stopped while the server cannot persist (a full disk), as SQLite's disk errors pass."""


def untrusted_certificate(exc: BaseException) -> bool:
    """Whether a connection failed because the server's TLS certificate is not trusted:
    redis-py keeps the ``ssl`` error as the cause of its ``ConnectionError``."""
    return isinstance(exc, redis.ConnectionError) and isinstance(
        exc.__cause__, ssl.SSLCertVerificationError
    )


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, AuthenticationError) or untrusted_certificate(exc):
        # ConnectionErrors to redis-py, but a wrong password or an unknown CA is set up
        # wrong, not down: waited out, it would hand every thread back forever without a
        # word of why.
        return False
    return isinstance(exc, TRANSIENT_ERRORS) or (
        isinstance(exc, ResponseError) and str(exc).startswith(_PASSING_REPLIES)
    )
