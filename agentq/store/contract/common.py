"""What the parts of the store contract share: the ``UNSET`` marker, a lease taken or to
renew, and the refusals every backend words the same way."""

from __future__ import annotations

from typing import Final, NamedTuple

from agentq.errors import (
    CheckpointNotFound,
    FinalCheckpoint,
    GraphStepMoved,
    InvalidArgument,
    RetryNotDue,
)
from agentq.records import Status, ThreadMeta


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = _Unset()
"""Marks an optional meta value the caller leaves as it is (``None`` is a value)."""


class Renewal(NamedTuple):
    """One lease to extend in :meth:`~agentq.store.contract.Store.renew_many`."""

    thread_id: str
    owner: str
    token: int
    ttl: float


class Taken(NamedTuple):
    """What :meth:`~agentq.store.contract.Store.acquire_to_run` found and did."""

    meta: ThreadMeta
    """The thread's meta as the call left it (``running``, its ``fence`` the token, when
    it was leased)."""
    token: int | None
    """The new fencing token, or ``None``: the thread does not run by itself (it is done,
    failed, cancelled, needs attention, or waits for a person without a timeout) and was
    not leased."""
    lost_worker: bool
    """This call counted a lost worker in the thread's ``crashes``."""


def check_ttl(thread_id: str, ttl: float) -> None:
    """Refuse a lease TTL that would expire at once (under a millisecond)."""
    if int(ttl * 1000) < 1:
        raise InvalidArgument(
            f"lease ttl must be at least 0.001 s, got {ttl!r}; use the lease_ttl setting "
            "(default 30 s)",
            thread_id=thread_id,
        )


def retry_not_due(thread_id: str, seconds: float) -> RetryNotDue:
    return RetryNotDue(
        f"the thread is due in {seconds:.1f} s (a retry's wait, or a wait for a human that "
        "times out then); leave it, recovery sends it then",
        thread_id=thread_id,
        seconds=seconds,
    )


def checkpoint_not_stored(
    thread_id: str, step: int, first: int | None, latest: int | None, *, forking: bool = False
) -> CheckpointNotFound:
    """The refusal to read (or fork) checkpoint ``step`` when the thread holds steps
    ``first`` to ``latest`` (``latest`` ``None`` or below 0: none). It names the steps
    held, not a count: the store answering need not have the ``keep_last`` of the
    workers that pruned them."""
    if latest is None or latest < 0:
        why = "the store holds no checkpoint of this thread"
    elif step > latest:
        why = f"it was never written: the latest is {latest}"
    else:
        why = (
            f"the thread holds steps {first or 0} to {latest} (older ones were pruned by the "
            "keep_last setting of the workers that wrote them, raise it to keep more; a fork "
            "starts at the step it copied)"
        )
    return CheckpointNotFound(
        f"{'cannot fork: ' if forking else ''}checkpoint {step} is not stored: {why}; list "
        f"the stored steps with 'agentq history {thread_id}' (store.history in code)",
        thread_id=thread_id,
        step=step,
    )


def final_checkpoint(thread_id: str, step: int) -> FinalCheckpoint:
    """The refusal of a fork of the checkpoint a thread finished at."""
    earlier = (
        f"fork step {step - 1} to run the final node again"
        if step > 0
        else ("start a new thread with the same input")
    )
    return FinalCheckpoint(
        f"cannot fork step {step}: the thread finished there, so a fork would have no node "
        f"to run; {earlier}, or read the result with meta()",
        thread_id=thread_id,
        step=step,
    )


def refuse_graph_fork(thread_id: str, step: int, status: Status, latest: int) -> None:
    """Refuse a fork of a thread holding LangGraph checkpoints unless ``step`` is where
    they stand: its latest step, with no worker driving it. They are one chain per thread,
    and the pending writes of its newest checkpoints change in place as the graph goes on,
    so no earlier step's view of them can be told apart."""
    if step == latest and status.is_idle:
        return
    why = (
        f"its LangGraph checkpoints have moved on to step {latest}"
        if step != latest
        else f"it is {status.value}, so a worker may be writing its LangGraph checkpoints"
    )
    raise GraphStepMoved(
        f"cannot fork this LangGraph thread at step {step}: {why}, and a fork carries them "
        "as they stand. Fork its latest step while it waits or has stopped, or go back "
        "with LangGraph's own time travel on the same thread: graph.get_state_history, "
        "then graph.update_state or graph.invoke with that checkpoint_id in the config",
        thread_id=thread_id,
        step=step,
    )
