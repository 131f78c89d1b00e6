"""Reading the scripts' and commands' replies: bytes into text and fields, refusal codes
into the :mod:`agentq.errors` exception that names the thread, the step and the fix."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentq.codec.envelope import encode_value
from agentq.errors import (
    AgentqError,
    EffectError,
    LeaseHeld,
    LogConflict,
    StaleToken,
    StepConflict,
    StoreConfigError,
    ThreadNotFound,
    ThreadStateError,
)
from agentq.store.contract import retry_not_due
from agentq.store.redis.refusal import Refusal, refusal_of


def text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def blob(value: object) -> bytes:
    if not isinstance(value, bytes):  # the store refuses decoding clients; this is a bug
        raise StoreConfigError(f"expected bytes from Redis, got {type(value).__name__}")
    return value


def hash_to_fields(flat: list[bytes]) -> dict[str, bytes]:
    """A hash from a script's flat ``HGETALL`` reply."""
    return {flat[i].decode(): flat[i + 1] for i in range(0, len(flat), 2)}


def fields(record: Any) -> dict[str, bytes]:
    """A hash from redis-py's ``HGETALL`` answer."""
    return {text(k): v for k, v in record.items()}


def pairs(values: dict[str, Any]) -> list[Any]:
    return [item for pair in values.items() for item in pair]


def log_fields(logs: Mapping[str, int]) -> bytes:
    """The meta's ``log_fields``: the append-only fields of the latest checkpoint."""
    if not logs:
        return b""
    return encode_value(sorted(logs), what="log fields", thread_id=None, step=None)


def stale(thread_id: str, token: int, fence: int, step: int | None = None) -> StaleToken:
    return StaleToken(
        f"fencing token {token} is stale: the thread's current token is {fence}, so "
        "another worker has taken it over; stop driving this thread",
        thread_id=thread_id,
        step=step,
    )


def not_holder(thread_id: str, key: str, token: int, holder: int) -> StaleToken:
    return StaleToken(
        f"effect {key!r} is not pending under token {token} (holder: {holder}); "
        "another driver owns it now",
        thread_id=thread_id,
    )


def refusal_error(
    refusal: Refusal,
    value: Any,
    *,
    thread_id: str,
    token: int = 0,
    step: int | None = None,
    key: str = "",
) -> AgentqError:
    """The exception a script's refusal means; ``value`` is what the script put beside it."""
    if refusal is Refusal.STALE_TOKEN:
        return stale(thread_id, token, int(value), step)
    if refusal is Refusal.STEP_CONFLICT:
        return StepConflict(
            f"cannot commit step {step}: the latest stored step is {value}, not "
            f"{(step or 0) - 1}; another driver wrote it, reload with latest()",
            thread_id=thread_id,
            step=step or 0,
            latest=value,
        )
    if refusal is Refusal.THREAD_NOT_FOUND:
        return ThreadNotFound(
            "the store holds no such thread; create it with open_thread()",
            thread_id=thread_id,
            step=step,
        )
    if refusal is Refusal.NOT_CLAIMED:
        return EffectError(
            f"effect {key!r} was never claimed; call claim_effect() before completing it",
            thread_id=thread_id,
        )
    if refusal is Refusal.NOT_HOLDER:
        return not_holder(thread_id, key, token, int(value))
    if refusal is Refusal.STATUS_REFUSED:
        return ThreadStateError(
            f"the thread is {text(value)}, which does not allow this; see it with 'agentq "
            f"show {thread_id}' (task.thread in code)",
            thread_id=thread_id,
            status=text(value),
        )
    if refusal is Refusal.LOG_CONFLICT:
        return LogConflict(
            f"the stored log of state.{text(value)} does not end where this checkpoint "
            "continues it; reload the thread with latest() and continue from there",
            thread_id=thread_id,
            step=step,
        )
    if refusal is Refusal.RETRY_NOT_DUE:
        return retry_not_due(thread_id, int(value) / 1000)
    return LeaseHeld(
        f"another worker drives this thread for {value} ms more; leave it to that "
        "worker (recovery takes over if it dies)",
        thread_id=thread_id,
        ttl_ms=int(value),
    )


def raise_refusal(
    code: int,
    value: Any,
    *,
    thread_id: str,
    token: int = 0,
    step: int | None = None,
    key: str = "",
) -> None:
    """Raise what a reply's code means, if it is a refusal; return on success."""
    refusal = refusal_of(code)
    if refusal is not None:
        raise refusal_error(refusal, value, thread_id=thread_id, token=token, step=step, key=key)
