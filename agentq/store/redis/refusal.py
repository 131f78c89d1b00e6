"""The refusal codes the Lua scripts reply with, one meaning each in every script.

A script refuses with ``{code, value, ...}`` where ``code`` is negative; ``lua/_prelude.lua``
holds the same names in its ``REFUSAL`` table (a test keeps the two equal).
"""

from __future__ import annotations

from enum import IntEnum


class Refusal(IntEnum):
    """What a negative reply code means, and what the value beside it carries."""

    STALE_TOKEN = -1
    """The fencing token is not the thread's current one; value: the current fence."""
    STEP_CONFLICT = -2
    """The checkpoint does not follow the latest stored step; value: the latest step."""
    THREAD_NOT_FOUND = -3
    """No such thread."""
    NOT_CLAIMED = -4
    """The effect record was never claimed."""
    NOT_HOLDER = -5
    """The effect record is not pending under this token (and claim); value: its holder."""
    STATUS_REFUSED = -6
    """The thread's status does not allow the change; value: the status."""
    LOG_CONFLICT = -7
    """A log's stored length is not the one the checkpoint continues; value: the field."""
    RETRY_NOT_DUE = -8
    """A retrying thread was sent before its retry time; value: the milliseconds left."""
    LEASE_HELD = -9
    """Another owner holds the thread's lease; value: its remaining milliseconds."""


def refusal_of(code: int) -> Refusal | None:
    """The refusal a reply code means, or ``None`` for a success code (zero or above)."""
    return Refusal(code) if code < 0 else None
