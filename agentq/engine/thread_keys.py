"""A thread's concurrency key: at most N threads of a key run at once, the rest wait.

A driver enters its thread's key once it holds the lease and has found the thread still
to run, its lost worker counted by that take (a parked thread is ``queued`` when woken, so
none is counted then), before its first step, and leaves it when its task leaves the
thread, however that happens (finished, failed, waiting for a human, retrying, handed
over, cancelled, or an error): the slot is held across the steps of one task run, not
taken per step. A thread that finds the key full is parked by the store (``queued``, no
due time, lease released) and its task ends at once, so a waiting thread holds no pool
slot and nothing polls for it; the thread whose leaving frees a slot sends the waiter
first in line. See :mod:`agentq.store.contract.thread_keys` for what the store
guarantees.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum

from agentq.engine.store_retry import RetriedCalls
from agentq.records import ThreadMeta
from agentq.store.contract import Store
from agentq.store.contract.thread_keys import CANCEL_REQUESTED

logger = logging.getLogger("agentq")


@dataclass(frozen=True)
class KeySeat:
    """The concurrency key a thread runs under, how many threads of it run at once, and
    how to send the threads a freed slot lets start (the engine knows no broker)."""

    key: str
    cap: int
    start_grace: float
    """How long a woken thread may take to start before recovery sends it."""
    wake: Callable[[Sequence[str]], object]


@dataclass(frozen=True)
class KeyWait:
    """Why a drive ended before its first step: the thread waits for ``key``."""

    key: str
    position: int
    """1 for the thread that starts next."""


class KeyRefused(Enum):
    """Why entering a key gave the thread neither a slot nor a place in the queue."""

    CANCEL_REQUESTED = "cancel requested"
    """Its cancel was asked for after its driver took the lease: the driver cancels it."""


@contextmanager
def seated(
    calls: RetriedCalls, owner: str, token: int, seat: KeySeat | None
) -> Iterator[KeyWait | KeyRefused | None]:
    """Hold a slot of ``seat``'s key for the block (``None``, the thread may run), or
    park the thread (a :class:`KeyWait`), or enter neither (a :class:`KeyRefused`): the
    block must not run the thread then."""
    if seat is None:
        yield None
        return
    store, thread_id = calls.store, calls.thread_id
    position = calls(
        "entering its concurrency key", store.enter_key, thread_id, owner, token, seat.key, seat.cap
    )
    if position == CANCEL_REQUESTED:
        yield KeyRefused.CANCEL_REQUESTED
        return
    if position:
        logger.info(
            "thread %s: concurrency key %s is full (%d at once); parked at position %d",
            thread_id,
            seat.key,
            seat.cap,
            position,
        )
        yield KeyWait(seat.key, position)
        return
    try:
        yield None
    finally:
        leave(calls, token, seat)


def leave(calls: RetriedCalls, token: int, seat: KeySeat) -> None:
    """Give back the slot ``token`` holds, if any, and send the waiters the slots freed
    (one reserved for a thread that stopped before entering is free by then) let start."""
    store, thread_id = calls.store, calls.thread_id
    try:
        woken = calls(
            "leaving its concurrency key",
            store.leave_key,
            thread_id,
            token,
            seat.key,
            start_grace=seat.start_grace,
            cap=seat.cap,
        )
    except Exception as exc:
        if not store.is_transient(exc):
            raise
        # The slot belongs to a lease this driver no longer renews: it dies with it,
        # and the sweeper then wakes the next waiter.
        logger.warning(
            "thread %s: store unreachable leaving concurrency key %s; its slot comes back "
            "with the lease",
            thread_id,
            seat.key,
        )
        return
    if woken:
        logger.info("thread %s: concurrency key %s starts %s", thread_id, seat.key, woken)
        seat.wake(woken)


def give_back(store: Store, meta: ThreadMeta, seat: KeySeat) -> None:
    """Send the waiters that the slot of a thread that stopped outside a drive (cancelled
    while queued, perhaps woken with a slot reserved) lets start, rather than leave them
    to the next sweep."""
    woken = store.leave_key(
        meta.thread_id, meta.fence, seat.key, start_grace=seat.start_grace, cap=seat.cap
    )
    if woken:
        seat.wake(woken)
