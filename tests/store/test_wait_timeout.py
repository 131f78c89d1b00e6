"""A wait for a human with a timeout, in the store contract (every backend): the wait is
a due time like a retry's, and either the resume or the timeout wins, atomically."""

from __future__ import annotations

import time

import pytest

from agentq.errors import RetryNotDue, ThreadStateError
from agentq.records import Checkpoint, Status
from agentq.store.contract import Store
from tests.store.raw import snapshot
from tests.support.redis_server import wait_until

TTL = 30.0
ASK = {"ask": "approve refund?"}


def waiting(
    store: Store, timeout: float, *, by_commit: bool = False, cancel_first: bool = False
) -> int:
    """t1 waiting on ASK with ``timeout``: paused by ``set_status`` (``run.interrupt``) or
    by committing an ``Interrupt`` step; with ``cancel_first``, a cancel asked while the
    node ran."""
    store.open_thread("t1", task="agent")
    token = store.acquire("t1", "w1", TTL)
    if cancel_first:
        assert store.request_cancel("t1") == Status.RUNNING
    if by_commit:
        checkpoint = Checkpoint(step=0, node="after", token=token, task="agent")
        store.commit(
            "t1",
            token,
            checkpoint,
            status=Status.WAITING,
            due_in=timeout,
            interrupt=ASK,
            release_owner="w1",
        )
    else:
        store.set_status(
            "t1", token, Status.WAITING, due_in=timeout, interrupt=ASK, release_owner="w1"
        )
    return token


@pytest.mark.parametrize("by_commit", [False, True])
def test_a_wait_with_a_timeout_is_due_then_and_not_before(store: Store, by_commit: bool) -> None:
    before = time.time()
    token = waiting(store, 30, by_commit=by_commit)
    meta = store.meta("t1")
    assert meta is not None and meta.status == Status.WAITING and meta.runs_by_itself
    assert meta.timeout == 30 and meta.timeout_at is not None and not meta.timed_out
    assert store.schedules(["t1"])[0].due_at == pytest.approx(meta.timeout_at)
    assert before + 30 <= meta.timeout_at <= time.time() + 30
    unchanged = snapshot(store)
    with pytest.raises(RetryNotDue) as info:
        store.acquire("t1", "w2", TTL)
    assert 29 < info.value.seconds <= 30
    assert snapshot(store) == unchanged  # no token handed out, still waiting
    assert store.meta("t1").fence == token  # type: ignore[union-attr]


@pytest.mark.parametrize("by_commit", [False, True])
def test_a_timed_out_wait_runs_on_with_the_unanswered_question(
    store: Store, by_commit: bool
) -> None:
    waiting(store, 0.05, by_commit=by_commit)
    wait_until(lambda: store.due(), timeout=5, what="the timeout due")
    meta, token, _ = store.acquire_to_run("t1", "w2", TTL)
    assert token is not None and meta == store.meta("t1")
    assert (meta.status, meta.timed_out, meta.interrupt) == (Status.RUNNING, True, ASK)
    assert (meta.timeout, meta.timeout_at) == (0.05, None)
    assert not meta.resumed
    # The timeout took it out of its wait: a resume now is refused, nothing changes.
    with pytest.raises(ThreadStateError, match="running"):
        store.reopen("t1", from_statuses=meta.resumable_from, resume_value=True)
    step = meta.step + 1
    store.commit("t1", token, Checkpoint(step=step, node="next", token=token, task="agent"))
    meta = store.meta("t1")
    assert meta is not None and not meta.timed_out and meta.timeout is None
    assert meta.interrupt is None


def test_a_resume_before_the_timeout_wins_and_the_timeout_never_fires(store: Store) -> None:
    waiting(store, 1)
    meta = store.reopen("t1", from_statuses={Status.WAITING}, resume_value="yes", start_grace=30)
    assert (meta.status, meta.timeout, meta.timeout_at) == (Status.QUEUED, None, None)
    # Due at its start grace, no longer at the timeout.
    assert store.schedules(["t1"])[0].due_at == pytest.approx(meta.updated_at + 30, abs=1)
    store.acquire("t1", "w2", TTL)
    meta = store.meta("t1")
    assert meta is not None and (meta.resume_value, meta.timed_out) == ("yes", False)


def test_a_retried_failure_after_a_timeout_times_out_again(store: Store) -> None:
    waiting(store, 0)
    token = store.acquire("t1", "w2", TTL)
    store.set_status("t1", token, Status.FAILED, error="InterruptTimedOut", release_owner="w2")
    meta = store.meta("t1")
    assert meta is not None and meta.resumable_from == {Status.WAITING}  # no late answer
    store.reopen("t1", from_statuses={Status.FAILED}, start_grace=0)
    store.acquire("t1", "w3", TTL)
    meta = store.meta("t1")
    assert meta is not None and (meta.timed_out, meta.interrupt, meta.timeout) == (True, ASK, 0)


def test_a_new_wait_without_a_timeout_clears_the_old_one(store: Store) -> None:
    waiting(store, 0)
    token = store.acquire("t1", "w2", TTL)
    store.set_status("t1", token, Status.WAITING, interrupt=ASK, release_owner="w2")
    meta = store.meta("t1")
    assert meta is not None and not meta.runs_by_itself
    assert (meta.timeout, meta.timeout_at, meta.timed_out) == (None, None, False)
    assert store.due() == []


def test_cancelling_a_wait_drops_its_timeout(store: Store) -> None:
    waiting(store, 30)
    assert store.request_cancel("t1") == Status.CANCELLED
    meta = store.meta("t1")
    assert meta is not None and meta.timeout_at is None and not meta.runs_by_itself
    assert store.due() == []


@pytest.mark.parametrize("by_commit", [False, True])
def test_a_cancel_asked_while_the_node_ran_stops_the_thread_at_its_wait(
    store: Store, by_commit: bool
) -> None:
    """The wait is the boundary the cancel stops the thread at, in the driver's own write:
    a resume sent before the driver could act on the flag finds nothing waiting, rather
    than clear the cancel and run the thread on with its answer."""
    token = waiting(store, 30, by_commit=by_commit, cancel_first=True)
    meta = store.meta("t1")
    assert meta is not None and meta.status == Status.CANCELLED and meta.cancel_requested
    assert (meta.fence, meta.timeout_at) == (token, None) and store.due() == []
    unchanged = snapshot(store)
    with pytest.raises(ThreadStateError, match="cancelled"):
        store.reopen("t1", from_statuses={Status.WAITING}, resume_value="yes")
    assert snapshot(store) == unchanged
    # The driver's own cancel at the wait, right after, is still under its token.
    store.set_status("t1", token, Status.CANCELLED, release_owner="w1")
    assert store.meta("t1").status == Status.CANCELLED  # type: ignore[union-attr]
