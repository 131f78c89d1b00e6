"""The store contract, run against every backend (see ``conftest.py``)."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import msgpack
import pytest

from agentq.errors import (
    ArtifactNotFound,
    CheckpointNotFound,
    CheckpointTooLarge,
    CorruptCheckpoint,
    EffectError,
    FinalCheckpoint,
    GraphStepMoved,
    InvalidArgument,
    InvalidThreadId,
    LeaseHeld,
    LeaseLost,
    LogConflict,
    RetryNotDue,
    StaleToken,
    StepConflict,
    ThreadExists,
    ThreadNotFound,
    ThreadStateError,
    UnserializableState,
    UnsupportedVersion,
)
from agentq.records import Checkpoint, ListedThread, Listing, Status
from agentq.store.contract import UNSET, Renewal, Store, Taken
from agentq.store.graph_records import StoredCheckpoint, encode_refs
from tests.store.raw import overwrite_checkpoint, snapshot
from tests.support.redis_server import wait_until

TTL = 30.0


def started(store: Store, thread_id: str = "t1", owner: str = "w1") -> int:
    store.open_thread(thread_id, task="agent", input={"q": "hi"})
    return store.acquire(thread_id, owner, TTL)


def cp(step: int, token: int, **state: object) -> Checkpoint:
    return Checkpoint(step=step, node=f"node{step}", state=dict(state), token=token, task="agent")


# -- threads -----------------------------------------------------------------------------


def test_open_thread_creates_once_and_keeps_input(store: Store) -> None:
    meta, created = store.open_thread("t1", task="agent", input={"q": ("a", 1)})
    assert created
    assert (meta.status, meta.step, meta.task, meta.fence) == (Status.QUEUED, -1, "agent", 0)
    assert meta.input == {"q": ("a", 1)}
    again, created = store.open_thread("t1", task="other", input="ignored")
    assert not created
    assert again.task == "agent" and again.input == {"q": ("a", 1)}


def test_open_thread_keeps_its_first_send_options(store: Store) -> None:
    meta, _ = store.open_thread("t1", task="agent", options={"queue": "gpu", "priority": 3})
    assert meta.options == {"queue": "gpu", "priority": 3}
    store.open_thread("t1", task="agent", options={"queue": "cpu"})
    assert store.meta("t1").options == {"queue": "gpu", "priority": 3}  # type: ignore[union-attr]
    assert store.open_thread("t2", task="agent")[0].options == {}


def test_open_thread_keeps_the_task_that_first_sent_it(store: Store) -> None:
    assert store.open_thread("t1", task="agent", origin="task-1")[0].origin == "task-1"
    store.open_thread("t1", task="agent", origin="task-2")
    assert store.meta("t1").origin == "task-1"  # type: ignore[union-attr]
    assert store.open_thread("t2", task="agent")[0].origin is None


def test_open_thread_keeps_its_first_canvas_apart_from_its_send_options(store: Store) -> None:
    first, second = {"body": "[1]"}, {"body": "[2]"}
    opened, _ = store.open_thread("t1", task="agent", options={"queue": "gpu"}, canvas=first)
    assert (opened.options, opened.canvas) == ({"queue": "gpu"}, first)
    store.open_thread("t1", task="agent", canvas=second)
    meta = store.meta("t1")
    assert meta is not None and (meta.options, meta.canvas) == ({"queue": "gpu"}, first)
    assert store.open_thread("t2", task="agent")[0].canvas is None


def test_meta_of_unknown_thread_is_none(store: Store) -> None:
    assert store.meta("nobody") is None
    assert store.latest("nobody") is None


def test_queued_thread_is_due_after_its_start_grace(store: Store) -> None:
    store.open_thread("soon", task="agent", start_grace=0)
    store.open_thread("later", task="agent", start_grace=3600)
    assert [thread for thread, _ in store.due()] == ["soon"]


def test_threads_lists_by_status_newest_first(store: Store) -> None:
    for name in ("a", "b", "c"):
        store.open_thread(name, task="agent")
    token = store.acquire("b", "w1", TTL)
    assert [m.thread_id for m in store.threads(Status.QUEUED)] == ["c", "a"]
    assert [m.thread_id for m in store.threads(Status.RUNNING)] == ["b"]
    assert [m.thread_id for m in store.threads()] == ["b", "c", "a"]
    assert [m.thread_id for m in store.threads(limit=1, offset=1)] == ["c"]
    store.commit("b", token, cp(0, token), status=Status.DONE, result=1)
    assert [m.thread_id for m in store.threads(Status.DONE)] == ["b"]
    assert store.threads(Status.RUNNING) == []


def test_status_counts_every_status_from_the_indexes(store: Store) -> None:
    assert store.status_counts() == dict.fromkeys(Status, 0)
    for name in ("a", "b", "c"):
        store.open_thread(name, task="agent")
    token = store.acquire("b", "w1", TTL)
    store.commit("b", token, cp(0, token), status=Status.DONE, result=1)
    store.request_cancel("c")
    counts = store.status_counts()
    assert counts == {
        **dict.fromkeys(Status, 0),
        Status.QUEUED: 1,
        Status.DONE: 1,
        Status.CANCELLED: 1,
    }


def test_listing_pages_threads_with_what_a_list_shows(store: Store) -> None:
    assert store.listing() == Listing(dict.fromkeys(Status, 0), [])
    for name in ("queued", "held", "asks", "done", "failed", "gone"):
        store.open_thread(name, task="agent")
    started(store, "held", owner="host:42:w1")
    asks = started(store, "asks")
    store.set_status("asks", asks, Status.WAITING, interrupt={"ask": "ok?"}, release_owner="w1")
    done = started(store, "done")
    store.commit("done", done, cp(0, done), status=Status.DONE, result={"n": 1})
    failed = started(store, "failed")
    store.set_status("failed", failed, Status.FAILED, error="boom", attempts=3, crashes=1)
    store.request_cancel("gone")
    store.request_cancel("held")
    page = store.listing()
    assert page.counts == {
        **dict.fromkeys(Status, 0),
        Status.QUEUED: 1,
        Status.RUNNING: 1,
        Status.WAITING: 1,
        Status.DONE: 1,
        Status.FAILED: 1,
        Status.CANCELLED: 1,
    }
    assert [row.thread_id for row in page.rows] == [m.thread_id for m in store.threads(limit=50)]
    rows = {row.thread_id: row for row in page.rows}
    assert rows["held"]._replace(cursor="") == ListedThread(
        "held", Status.RUNNING, -1, None, "agent", 0, 0, rows["held"].updated_at, None, True,
        owner="host:42:w1",
    )  # fmt: skip
    assert rows["held"].updated_at == store.meta("held").updated_at  # type: ignore[union-attr]
    assert (rows["asks"].interrupt, rows["asks"].owner) == ({"ask": "ok?"}, None)
    assert (rows["done"].result, rows["done"].step, rows["done"].node) == ({"n": 1}, 0, "node0")
    assert (rows["failed"].error, rows["failed"].attempts, rows["failed"].crashes) == ("boom", 3, 1)
    assert rows["gone"].status is Status.CANCELLED and rows["queued"].interrupt is None
    assert store.listing(limit=2, after=page.rows[0].cursor).rows == page.rows[1:3]
    assert [row.thread_id for row in store.listing(Status.QUEUED).rows] == ["queued"]
    assert store.listing(Status.RETRYING).rows == []
    assert store.listing(limit=0).rows == []


def test_listing_pages_on_from_a_cursor_whatever_changes_between_pages(store: Store) -> None:
    """Offsets would skip a thread each time one above it changed status (an operator
    retrying the failed ones page by page); a cursor goes on from the row it names."""
    for n in range(7):
        token = started(store, f"f{n}")
        store.set_status(f"f{n}", token, Status.FAILED, error="boom", release_owner="w1")
    listed = [row.thread_id for row in store.listing(Status.FAILED, limit=10).rows]
    first = store.listing(Status.FAILED, limit=3)
    # The operator retries a thread of the first page; another, further down, is deleted.
    store.reopen(first.rows[1].thread_id, from_statuses={Status.FAILED})
    assert store.delete_thread(listed[4])
    second = store.listing(Status.FAILED, limit=3, after=first.rows[-1].cursor)
    third = store.listing(Status.FAILED, limit=3, after=second.rows[-1].cursor)
    assert [row.thread_id for row in second.rows + third.rows] == listed[3:4] + listed[5:]
    # All statuses together, the page's last thread gone from its index meanwhile.
    every = [row.thread_id for row in store.listing(limit=20).rows]
    top = store.listing(limit=2)
    assert store.delete_thread(top.rows[-1].thread_id)
    rest = store.listing(limit=20, after=top.rows[-1].cursor)
    assert [row.thread_id for row in rest.rows] == every[2:]
    for cursor in ("", "t1", "nan:t1", "1.5:", "step:t1", "1_700:t1", "5\t:t1", " 5:t1"):
        with pytest.raises(InvalidArgument, match="not a cursor"):
            store.listing(after=cursor)


def test_schedules_tell_the_lease_holder_and_the_due_time(store: Store) -> None:
    store.open_thread("queued", task="agent", start_grace=60)
    token = started(store, "held", owner="host:42:w1")
    store.open_thread("waiting", task="agent")
    store.request_cancel("waiting")
    queued, held, cancelled, unknown = store.schedules(["queued", "held", "waiting", "nope"])
    assert (queued.owner, queued.token, queued.lease_left) == (None, None, None)
    assert queued.due_at is not None and queued.due_at > time.time() + 30
    assert (held.owner, held.token) == ("host:42:w1", token)
    assert held.lease_left is not None and 0 < held.lease_left <= TTL
    assert held.due_at is not None
    assert (cancelled.owner, cancelled.due_at) == (None, None)
    assert unknown.thread_id == "nope" and unknown.due_at is None
    store.release("held", "host:42:w1", token)
    assert store.schedules(["held"])[0].owner is None


# -- lease -------------------------------------------------------------------------------


def test_acquire_hands_out_increasing_tokens_and_marks_running(store: Store) -> None:
    first = started(store)
    assert store.meta("t1").status == Status.RUNNING  # type: ignore[union-attr]
    assert store.release("t1", "w1", first)
    second = store.acquire("t1", "w2", TTL)
    assert second > first
    assert store.meta("t1").fence == second  # type: ignore[union-attr]


def test_acquire_to_run_reads_the_meta_the_new_lease_left(store: Store) -> None:
    store.open_thread("t1", task="agent", input={"q": "hi"}, options={"queue": "gpu"})
    meta, token, lost_worker = store.acquire_to_run("t1", "w1", TTL)
    assert token is not None and not lost_worker
    assert (meta.status, meta.fence, meta.input, meta.crashes) == (
        Status.RUNNING,
        token,
        {"q": "hi"},
        0,
    )
    assert meta == store.meta("t1")
    store.commit("t1", token, cp(0, token, n=1))
    assert store.release("t1", "w1", token)
    meta, again, lost_worker = store.acquire_to_run("t1", "w2", TTL)
    # Released but still running, as a worker lost mid-step leaves it once its lease ends.
    assert again is not None and again > token and lost_worker and meta.crashes == 1
    assert (meta.fence, meta.step, meta.options) == (again, 0, {"queue": "gpu"})
    assert meta == store.meta("t1")


def test_acquire_to_run_reads_what_a_retry_a_cancel_and_a_takeover_left(store: Store) -> None:
    token = started(store)
    store.set_status(
        "t1", token, Status.RETRYING, due_in=0, attempts=2, error="429", release_owner="w1"
    )
    meta, again, lost_worker = store.acquire_to_run("t1", "w2", 0.05)
    assert again is not None and not lost_worker
    assert (meta.status, meta.fence, meta.attempts, meta.error, meta.crashes) == (
        Status.RUNNING,
        again,
        2,
        "429",
        0,
    )
    assert meta == store.meta("t1")
    store.request_cancel("t1")
    # The lease runs out while the thread is running: the next owner takes it over.
    taken = wait_until(lambda: _try_acquire_to_run(store, "t1", "w3"), timeout=5, what="expiry")
    assert taken.token is not None and taken.token > again and taken.lost_worker
    assert taken.meta == store.meta("t1")
    assert (taken.meta.status, taken.meta.fence, taken.meta.crashes) == (
        Status.RUNNING,
        taken.token,
        1,
    )
    assert taken.meta.cancel_requested


def _try_acquire_to_run(store: Store, thread_id: str, owner: str) -> Taken | None:
    try:
        return store.acquire_to_run(thread_id, owner, TTL)
    except LeaseHeld:
        return None


def test_acquire_to_run_counts_a_lost_worker_once_when_asked_again(store: Store) -> None:
    """A reply lost to a dropped connection makes the driver ask again: it finds its own
    live lease, and the worker lost before it stays counted once, and still reported, so
    that the driver that asked twice fails a thread at ``max_crashes`` as one that asked
    once does."""
    store.open_thread("t1", task="agent")
    store.acquire("t1", "lost", 0.05)  # running, and its worker gone with the lease
    first = wait_until(lambda: _try_acquire_to_run(store, "t1", "w1"), timeout=5, what="expiry")
    again = store.acquire_to_run("t1", "w1", TTL)
    once_more = store.acquire_to_run("t1", "w1", TTL)
    assert first.lost_worker and again.lost_worker and once_more.lost_worker
    assert first.meta.crashes == again.meta.crashes == once_more.meta.crashes == 1
    assert again.token is not None and first.token is not None and again.token > first.token
    # A plain acquire is not a driver's: it counts nothing.
    store.release("t1", "w1", once_more.token)  # type: ignore[arg-type]
    store.acquire("t1", "w2", TTL)
    assert store.meta("t1").crashes == 1  # type: ignore[union-attr]


def test_acquire_to_run_asked_again_reports_no_lost_worker_its_take_did_not_count(
    store: Store,
) -> None:
    """Only the take that counted a lost worker reports one when asked again: a driver that
    took a queued thread, or one whose worker was lost before an earlier take, does not."""
    store.open_thread("t1", task="agent")
    taken = store.acquire_to_run("t1", "w1", TTL)
    assert not taken.lost_worker and not store.acquire_to_run("t1", "w1", TTL).lost_worker
    store.open_thread("t2", task="agent")
    store.acquire("t2", "lost", 0.05)
    counted = wait_until(lambda: _try_acquire_to_run(store, "t2", "w1"), timeout=5, what="expiry")
    assert counted.lost_worker and counted.token is not None
    store.release("t2", "w1", counted.token)
    store.acquire("t2", "w2", TTL)  # a plain acquire: its lease counted nothing
    again = store.acquire_to_run("t2", "w2", TTL)
    assert not again.lost_worker and again.meta.crashes == 1


def test_reopen_clears_the_lost_workers_of_a_thread_failed_for_them(store: Store) -> None:
    token = started(store)
    store.set_status("t1", token, Status.FAILED, crashes=3, error="lost", release_owner="w1")
    meta = store.reopen("t1", from_statuses={Status.FAILED})
    assert (meta.status, meta.crashes, meta.attempts, meta.error) == (Status.QUEUED, 0, 0, None)
    assert not store.acquire_to_run("t1", "w2", TTL).lost_worker


def test_acquire_to_run_leaves_a_thread_that_does_not_run_by_itself(store: Store) -> None:
    token = started(store, "done")
    store.commit("done", token, cp(0, token), status=Status.DONE, result={"n": 1})
    for status in (Status.FAILED, Status.NEEDS_ATTENTION, Status.WAITING):
        token = started(store, status.value)
        store.set_status(status.value, token, status, error="x", release_owner="w1")
    store.open_thread("cancelled", task="agent")
    store.request_cancel("cancelled")
    before = snapshot(store)
    for thread_id in ("done", "failed", "needs_attention", "waiting", "cancelled"):
        meta, token, lost_worker = store.acquire_to_run(thread_id, "w2", TTL)
        assert token is None and not lost_worker
        assert meta == store.meta(thread_id) and meta.status == Status(thread_id)
    assert store.acquire_to_run("done", "w2", TTL).meta.result == {"n": 1}
    assert snapshot(store) == before


def test_acquire_to_run_takes_a_wait_past_its_timeout(store: Store) -> None:
    token = started(store)
    store.set_status(
        "t1", token, Status.WAITING, interrupt={"ask": "ok?"}, due_in=0, release_owner="w1"
    )
    meta, again, _ = store.acquire_to_run("t1", "w2", TTL)
    assert again is not None and meta.status == Status.RUNNING and meta.timed_out


def test_acquire_to_run_refuses_as_acquire_does_and_changes_nothing(store: Store) -> None:
    with pytest.raises(ThreadNotFound, match="nobody"):
        store.acquire_to_run("nobody", "w1", TTL)
    started(store)
    before = snapshot(store)
    with pytest.raises(LeaseHeld):
        store.acquire_to_run("t1", "w2", TTL)
    assert snapshot(store) == before


def test_acquire_refused_while_another_owner_holds_the_lease(store: Store) -> None:
    started(store)
    with pytest.raises(LeaseHeld) as info:
        store.acquire("t1", "w2", TTL)
    assert info.value.thread_id == "t1" and 0 < info.value.ttl_ms <= TTL * 1000


def test_acquire_unknown_thread(store: Store) -> None:
    with pytest.raises(ThreadNotFound):
        store.acquire("nobody", "w1", TTL)


def test_expired_lease_is_taken_over_and_old_owner_fenced(store: Store) -> None:
    store.open_thread("t1", task="agent")
    old = store.acquire("t1", "w1", 0.05)
    store.commit("t1", old, cp(0, old))
    new = wait_until(lambda: _try_acquire(store, "t1", "w2"), timeout=5, what="lease expiry")
    assert new > old
    before = snapshot(store)
    with pytest.raises(StaleToken):
        store.commit("t1", old, cp(1, old))
    with pytest.raises(StaleToken):
        store.claim_effect("t1", "charge", old)
    with pytest.raises(LeaseLost):
        store.renew("t1", "w1", old, TTL)
    assert not store.release("t1", "w1", old)
    assert snapshot(store) == before
    store.commit("t1", new, cp(1, new))
    assert store.latest("t1").step == 1  # type: ignore[union-attr]


def _try_acquire(store: Store, thread_id: str, owner: str) -> int | None:
    try:
        return store.acquire(thread_id, owner, TTL)
    except LeaseHeld:
        return None


def test_renew_extends_the_lease(store: Store) -> None:
    store.open_thread("t1", task="agent")
    token = store.acquire("t1", "w1", 0.3)
    for _ in range(4):
        store.renew("t1", "w1", token, 0.3)
        with pytest.raises(LeaseHeld):
            store.acquire("t1", "w2", TTL)


def test_renew_many_renews_each_lease_and_names_the_lost_one(store: Store) -> None:
    for thread_id in ("t1", "t2", "t3"):
        store.open_thread(thread_id, task="agent")
    tokens = {t: store.acquire(t, "w1", 0.3) for t in ("t1", "t2", "t3")}
    store.release("t2", "w1", tokens["t2"])
    store.acquire("t2", "w2", TTL)  # t2 changed hands
    # Renewed for a minute, the leases outlive the 0.3 s they were taken for.
    leases = [Renewal(t, "w1", tokens[t], 60) for t in ("t1", "t2", "t3")]
    assert store.renew_many(leases) == [True, False, True]
    time.sleep(0.5)  # past the first expiry: time passing is what is tested
    for thread_id in ("t1", "t3"):
        with pytest.raises(LeaseHeld):
            store.acquire(thread_id, "w2", TTL)
    assert store.renew_many(leases) == [True, False, True]
    assert store.renew_many([]) == []


def test_running_thread_is_due_when_its_lease_expires(store: Store) -> None:
    store.open_thread("t1", task="agent", start_grace=3600)
    store.acquire("t1", "w1", 0.05)
    assert wait_until(lambda: store.due(), timeout=5, what="due entry")[0][0] == "t1"


# -- checkpoints -------------------------------------------------------------------------


def test_commit_and_load_round_trip_rich_state(store: Store) -> None:
    token = started(store)
    state = {
        "messages": [{"role": "user", "content": "hi"}],
        "when": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        "day": dt.date(2026, 1, 2),
        "blob": b"\x00\x01",
        "pair": (1, "a"),
        "tags": {"x", "y"},
        "frozen": frozenset({1}),
        7: "int key",
    }
    checkpoint = Checkpoint(
        step=0,
        node="model",
        state=state,
        pending=[{"id": "c1"}],
        cursors={"page": 3},
        task="agent",
        token=token,
        created_at=12.5,
    )
    store.commit("t1", token, checkpoint, due_in=TTL)
    assert store.latest("t1") == checkpoint
    assert store.checkpoint("t1", 0) == checkpoint
    meta = store.meta("t1")
    assert meta is not None and (meta.step, meta.node, meta.status) == (0, "model", Status.RUNNING)


def test_commit_requires_the_previous_step(store: Store) -> None:
    token = started(store)
    store.commit("t1", token, cp(0, token))
    before = snapshot(store)
    for step in (0, 2):
        with pytest.raises(StepConflict) as info:
            store.commit("t1", token, cp(step, token, other="state"))
        assert info.value.latest == 0 and info.value.step == step
    assert snapshot(store) == before


def test_first_commit_must_be_step_zero(store: Store) -> None:
    token = started(store)
    with pytest.raises(StepConflict):
        store.commit("t1", token, cp(1, token))
    assert store.latest("t1") is None


def test_commit_on_unknown_thread(store: Store) -> None:
    with pytest.raises(ThreadNotFound):
        store.commit("nobody", 1, cp(0, 1))


def test_done_commit_stores_result_releases_lease_and_leaves_due_index(store: Store) -> None:
    store.open_thread("t1", task="agent", start_grace=0)
    token = store.acquire("t1", "w1", 0.05)
    store.commit(
        "t1", token, cp(0, token), status=Status.DONE, result={"answer": 42}, release_owner="w1"
    )
    meta = store.meta("t1")
    assert meta is not None and meta.status == Status.DONE and meta.result == {"answer": 42}
    assert store.acquire("t1", "w2", TTL) > token  # the lease was released
    assert store.due() == []


def test_running_commit_can_leave_the_due_time_to_the_lease(store: Store) -> None:
    store.open_thread("t1", task="agent", start_grace=3600)
    token = store.acquire("t1", "w1", 0.05)
    store.commit("t1", token, cp(0, token), due_in=UNSET)
    assert wait_until(lambda: store.due(), timeout=5, what="due entry")[0][0] == "t1"
    store.commit("t1", token, cp(1, token), due_in=TTL)
    assert store.due() == []


def test_a_retrying_thread_cannot_be_acquired_before_its_retry_time(store: Store) -> None:
    token = started(store)
    store.set_status("t1", token, Status.RETRYING, due_in=30, release_owner="w1")
    before = snapshot(store)
    with pytest.raises(RetryNotDue) as info:
        store.acquire("t1", "w2", TTL)
    assert 29 < info.value.seconds <= 30
    assert snapshot(store) == before  # no token handed out, nothing changed
    store.set_status("t1", token, Status.RETRYING, due_in=0)
    assert store.acquire("t1", "w2", TTL) == token + 1
    assert store.meta("t1").status == Status.RUNNING  # type: ignore[union-attr]


def test_set_status_is_fenced_and_schedules(store: Store) -> None:
    token = started(store)
    store.set_status(
        "t1", token, Status.RETRYING, due_in=0, attempts=2, error="429", release_owner="w1"
    )
    meta = store.meta("t1")
    assert meta is not None
    assert (meta.status, meta.attempts, meta.error) == (Status.RETRYING, 2, "429")
    assert [t for t, _ in store.due()] == ["t1"]
    newer = store.acquire("t1", "w2", TTL)
    with pytest.raises(StaleToken):
        store.set_status("t1", token, Status.FAILED)
    store.set_status("t1", newer, Status.WAITING, interrupt={"ask": "ok?"}, error=None)
    meta = store.meta("t1")
    assert meta is not None
    assert (meta.status, meta.interrupt, meta.error) == (Status.WAITING, {"ask": "ok?"}, None)
    assert store.due() == []


def test_a_status_set_with_a_raised_fence_refuses_the_runs_later_writes(store: Store) -> None:
    """A run failed from outside (its hard time limit) while its process may still write:
    its next commit, claim or status change is refused, and the thread stays failed."""
    token = started(store)
    store.commit("t1", token, cp(0, token))
    store.set_status(
        "t1", token, Status.FAILED, error="time limit", release_owner="w1", raise_fence=True
    )
    with pytest.raises(StaleToken):
        store.commit("t1", token, cp(1, token))
    with pytest.raises(StaleToken):
        store.claim_effect("t1", "mail-1", token)
    with pytest.raises(StaleToken):
        store.set_status("t1", token, Status.RUNNING)
    meta = store.meta("t1")
    assert meta is not None
    assert (meta.status, meta.step, meta.error, meta.fence) == (
        Status.FAILED,
        0,
        "time limit",
        token + 1,
    )
    assert store.schedules(["t1"])[0].owner is None


def test_a_commit_clears_the_error_an_earlier_attempt_left(store: Store) -> None:
    token = started(store)
    store.set_status(
        "t1", token, Status.RETRYING, due_in=0, attempts=1, error="429", release_owner="w1"
    )
    newer = store.acquire("t1", "w2", TTL)
    store.commit("t1", newer, cp(0, newer))
    meta = store.meta("t1")
    assert meta is not None and (meta.attempts, meta.error) == (0, None)


def test_retention_keeps_the_last_n(store: Store) -> None:
    token = started(store)
    for step in range(9):
        store.commit("t1", token, cp(step, token, n=step))
    assert [c.step for c in store.history("t1")] == [8, 7, 6, 5, 4]
    with pytest.raises(CheckpointNotFound):
        store.checkpoint("t1", 3)


def test_history_pages_newest_first(store: Store) -> None:
    token = started(store)
    for step in range(5):
        store.commit("t1", token, cp(step, token))
    page = store.history("t1", limit=2)
    assert [c.step for c in page] == [4, 3]
    assert [c.step for c in store.history("t1", before=page[-1].step, limit=2)] == [2, 1]
    assert [c.step for c in store.history("t1", before=1, limit=2)] == [0]
    assert store.history("t1", before=0) == []
    assert store.history("nobody") == []


def test_fork_copies_a_checkpoint_into_a_new_thread(store: Store) -> None:
    store.open_thread("t1", task="agent", input={"q": "hi"}, options={"queue": "gpu"})
    token = store.acquire("t1", "w1", TTL)
    for step in range(3):
        store.commit("t1", token, cp(step, token, n=step))
    meta = store.fork("t1", 1, "t1-fork")
    assert (meta.status, meta.step, meta.node) == (Status.WAITING, 1, "node1")
    assert (meta.task, meta.input, meta.options) == ("agent", {"q": "hi"}, {"queue": "gpu"})
    assert store.latest("t1-fork") == store.checkpoint("t1", 1)
    assert store.latest("t1").step == 2  # type: ignore[union-attr]
    fork_token = store.acquire("t1-fork", "w2", TTL)
    store.commit("t1-fork", fork_token, cp(2, fork_token, n="forked"))
    assert store.checkpoint("t1", 2).state == {"n": 2}
    with pytest.raises(ThreadExists):
        store.fork("t1", 1, "t1-fork")
    with pytest.raises(CheckpointNotFound):
        store.fork("t1", 9, "t1-other")


def test_fork_of_the_step_a_thread_finished_at_is_refused(store: Store) -> None:
    token = started(store)
    store.commit("t1", token, cp(0, token))
    final = Checkpoint(step=1, node=None, token=token, task="agent")
    store.commit("t1", token, final, status=Status.DONE, result="ok", release_owner="w1")
    with pytest.raises(FinalCheckpoint, match=r"step 1:.*finished.*fork step 0") as info:
        store.fork("t1", 1, "t1-fork")
    assert (info.value.thread_id, info.value.step) == ("t1", 1)
    assert store.meta("t1-fork") is None
    assert store.fork("t1", 0, "t1-fork").node == "node0"


def _graph_put(store: Store, ns: str, checkpoint_id: str, token: int | None) -> None:
    field = f"channel:{ns}".encode()
    stored = StoredCheckpoint(
        checkpoint_id=checkpoint_id,
        record=f"record {ns} {checkpoint_id}".encode(),
        refs=encode_refs([field]),
        run_id="run1",
        blobs={field: f"value {checkpoint_id}".encode()},
    )
    store.graph().put("t1", ns, stored, token)
    store.graph().put_writes("t1", ns, checkpoint_id, [(b"task", b"write", False)], token, "run1")


def _graph_rows(store: Store, thread_id: str) -> list[Any]:
    graph = store.graph()
    return [
        row
        for ns in graph.namespaces(thread_id)
        for row in graph.page(thread_id, ns, before=None, limit=9)
    ]


def _without_graph_index(snap: Any) -> Any:
    # The global LangGraph indexes may name a deleted thread (see graph_keys).
    return {k: v for k, v in snap.items() if not (isinstance(k, bytes) and b"lg:{index}" in k)}


def test_fork_carries_the_langgraph_checkpoints_of_the_step_they_stand_on(store: Store) -> None:
    token = started(store)
    store.commit("t1", token, cp(0, token))
    _graph_put(store, "", "c1", token)
    _graph_put(store, "sub:task1", "c2", token)
    running = snapshot(store)
    # While a worker drives the thread its LangGraph checkpoints move under the fork.
    with pytest.raises(GraphStepMoved, match=r"step 0: .*it is running") as info:
        store.fork("t1", 0, "f1")
    assert (info.value.thread_id, info.value.step) == ("t1", 0)
    assert snapshot(store) == running
    store.commit("t1", token, cp(1, token), status=Status.WAITING, release_owner="w1")
    waiting = snapshot(store)
    # An earlier step stood on fewer of them, and which is not recorded.
    with pytest.raises(GraphStepMoved, match=r"moved on to step 1.*checkpoint_id"):
        store.fork("t1", 0, "f1")
    assert snapshot(store) == waiting
    assert store.fork("t1", 1, "f1").status == Status.WAITING
    assert _graph_rows(store, "f1") == _graph_rows(store, "t1") != []
    assert "f1" in store.graph().threads()
    assert store.delete_thread("f1")
    assert _without_graph_index(snapshot(store)) == _without_graph_index(waiting)


def test_gc_of_a_graph_thread_leaves_no_entry_in_the_langgraph_indexes(store: Store) -> None:
    """Every graph thread gc deletes would otherwise leave its id behind for good."""
    store.graph()  # its tables, on SQLite
    before = snapshot(store)
    token = started(store)
    _graph_put(store, "", "c1", token)
    store.commit("t1", token, cp(0, token), status=Status.DONE, release_owner="w1")
    assert store.graph().threads() == ["t1"]
    assert store.gc(0) == 1
    assert store.graph().threads() == []
    assert snapshot(store) == before


def test_a_langgraph_write_refused_for_a_deleted_thread_leaves_no_index_entry(
    store: Store,
) -> None:
    """A graph task's thread deleted while its node ran: its next LangGraph checkpoint is
    refused, and the entries the put makes ahead of its data must not outlive it (nothing
    would ever delete them: the thread is gone)."""
    store.graph()  # its tables, on SQLite
    before = snapshot(store)
    token = started(store)
    assert store.delete_thread("t1")
    with pytest.raises(ThreadNotFound):
        _graph_put(store, "", "c1", token)  # store.graph(): a process that never indexed it
    assert store.graph().threads() == []
    assert snapshot(store) == before


def test_a_graph_fork_into_a_taken_id_leaves_no_index_entry_for_it(store: Store) -> None:
    token = started(store)
    store.commit("t1", token, cp(0, token))
    _graph_put(store, "", "c1", token)
    store.commit("t1", token, cp(1, token), status=Status.WAITING, release_owner="w1")
    store.open_thread("taken", task="agent")
    before = snapshot(store)
    with pytest.raises(ThreadExists):
        store.fork("t1", 1, "taken")
    assert snapshot(store) == before
    assert store.graph().threads() == ["t1"]


@pytest.mark.parametrize("order", [["run1"], ["run2", "run1"], ["run1", "run2"]])
def test_deleting_every_run_of_a_saver_thread_leaves_nothing_behind(
    store: Store, order: list[str]
) -> None:
    """A plain saver's thread (no agentq thread) whose runs LangGraph deletes one by one:
    once its last checkpoint goes, no key and no index entry of it may stay for good, nor
    of a run that only wrote to it (resumed it, and was interrupted again)."""
    store.graph()  # its tables, on SQLite
    before = snapshot(store)
    _graph_put(store, "", "c1", None)
    _graph_put(store, "sub:task1", "c2", None)
    store.graph().put_writes("t1", "", "c1", [(b"resume", b"answer", True)], None, "run2")
    for run in order:
        store.graph().delete_runs([run])
    assert store.graph().threads() == []
    assert snapshot(store) == before


def test_deleting_the_runs_a_prune_left_leaves_nothing_behind(store: Store) -> None:
    """A prune drops the checkpoints of earlier runs, not their runs' records: once the
    runs left are deleted, those go with the thread's last checkpoint."""
    store.graph()  # its tables, on SQLite
    before = snapshot(store)
    for checkpoint_id, run_id in (("c1", "run1"), ("c2", "run2")):
        stored = StoredCheckpoint(
            checkpoint_id=checkpoint_id, record=b"record", refs=encode_refs([]), run_id=run_id
        )
        store.graph().put("t1", "", stored, None)
    store.graph().keep_latest("t1", {"": ["c2"]})
    store.graph().delete_runs(["run2"])
    assert store.graph().threads() == []
    assert snapshot(store) == before


def test_delete_thread_removes_everything_it_owns(store: Store) -> None:
    store.open_thread("keep", task="agent")
    before = snapshot(store)
    token = started(store, "gone")
    store.commit("gone", token, cp(0, token))
    store.claim_effect("gone", "charge", token)
    assert store.delete_thread("gone")
    assert store.meta("gone") is None and store.latest("gone") is None
    assert store.effect("gone", "charge") is None
    assert not store.delete_thread("gone")
    assert snapshot(store) == before


@pytest.mark.parametrize("removal", ["delete", "gc"])
def test_a_thread_that_used_every_kind_of_key_leaves_nothing_behind(
    store: Store, removal: str
) -> None:
    """Logs, snapshots inline and staged, artifacts, effect records, LangGraph
    checkpoints in two namespaces with their writes (one from another run), a retry
    timer: deleted or expired, the thread leaves the store as it was before it, indexes
    included."""
    store.graph()  # its tables, on SQLite
    store.open_thread("keep", task="agent")
    before = snapshot(store)
    token = started(store)
    messages: list[object] = []
    for step in range(7):
        appended = len(messages)
        messages = [*messages, {"n": step, "text": "x" * 4000}]
        big = "y" * (40_000 if step % 2 else 10)  # every other snapshot staged on Redis
        store.commit(
            "t1", token, cp(step, token, messages=messages, big=big), logs={"messages": appended}
        )
    store.put_artifact("t1", b"bytes" * 1000)
    store.claim_effect("t1", "charge", token)
    store.complete_effect("t1", "charge", token, {"ok": True})
    store.claim_effect("t1", "email", token)
    _graph_put(store, "", "c1", token)
    _graph_put(store, "sub:task1", "c2", token)
    # A later run's write to run1's checkpoint (the answer it resumed with).
    store.graph().put_writes("t1", "", "c1", [(b"resume", b"answer", True)], token, "run2")
    store.set_status("t1", token, Status.RETRYING, due_in=0, release_owner="w1")
    token = store.acquire("t1", "w2", TTL)
    store.commit(
        "t1",
        token,
        cp(7, token, messages=messages),
        status=Status.DONE,
        logs={"messages": len(messages)},
    )
    if removal == "delete":
        assert store.delete_thread("t1")
    else:
        assert store.gc(0) == 1
    assert store.graph().threads() == []
    assert snapshot(store) == before


def test_gc_deletes_finished_threads_after_their_ttl(store: Store) -> None:
    for name in ("done", "running"):
        token = started(store, name)
        store.commit(
            name, token, cp(0, token), status=Status.DONE if name == "done" else Status.RUNNING
        )
    assert store.gc(finished_ttl=3600) == 0
    assert store.gc(finished_ttl=0) == 1
    assert store.meta("done") is None and store.meta("running") is not None


def test_gc_deletes_only_the_statuses_it_is_given(store: Store) -> None:
    for status in (Status.DONE, Status.FAILED, Status.NEEDS_ATTENTION, Status.WAITING):
        token = started(store, status.value)
        store.set_status(status.value, token, status, release_owner="w1")
    assert store.gc(0, {Status.DONE, Status.CANCELLED}) == 1
    assert store.meta("failed") is not None and store.meta("needs_attention") is not None
    assert store.gc(0, {Status.FAILED, Status.NEEDS_ATTENTION}) == 2
    assert [t.thread_id for t in store.threads()] == ["waiting"]
    with pytest.raises(InvalidArgument, match="waiting"):
        store.gc(0, {Status.WAITING})


def test_gc_with_a_limit_deletes_at_most_that_many(store: Store) -> None:
    for status in (Status.DONE, Status.FAILED, Status.CANCELLED):
        token = started(store, status.value)
        store.set_status(status.value, token, status, release_owner="w1")
    assert store.gc(0, limit=2) == 2
    assert len(store.threads()) == 1
    assert store.gc(0, limit=2) == 1
    assert store.threads() == []
    with pytest.raises(InvalidArgument, match="limit"):
        store.gc(0, limit=0)


def test_gc_refuses_a_ttl_that_is_not_a_number(store: Store) -> None:
    token = started(store, "done")
    store.commit("done", token, cp(0, token), status=Status.DONE)
    with pytest.raises(InvalidArgument, match="finished_ttl is NaN"):
        store.gc(float("nan"))
    assert store.gc(float("inf")) == 0  # nothing is that old
    assert store.meta("done") is not None


# -- effects -----------------------------------------------------------------------------


def test_effect_claim_complete_replay(store: Store) -> None:
    token = started(store)
    claim = store.claim_effect("t1", "charge-1", token)
    assert claim.outcome == "claimed"
    assert store.claim_effect("t1", "charge-1", token).outcome == "unknown"
    store.complete_effect("t1", "charge-1", token, {"id": "ch_1"})
    replay = store.claim_effect("t1", "charge-1", token)
    assert (replay.outcome, replay.effect.result) == ("done", {"id": "ch_1"})
    assert store.effect("t1", "charge-1").state == "done"  # type: ignore[union-attr]


def test_pending_effect_from_a_dead_owner_can_be_taken_over(store: Store) -> None:
    old = started(store)
    store.claim_effect("t1", "email", old)
    store.release("t1", "w1", old)
    new = store.acquire("t1", "w2", TTL)
    assert store.claim_effect("t1", "email", new).outcome == "unknown"
    with pytest.raises(StaleToken):
        store.complete_effect("t1", "email", old, "sent")
    assert store.claim_effect("t1", "email", new, takeover=True).outcome == "claimed"
    store.complete_effect("t1", "email", new, "sent")
    assert store.effect("t1", "email").result == "sent"  # type: ignore[union-attr]


@pytest.mark.parametrize("shared", [False, True])
def test_a_released_claim_runs_again_under_the_next_token(store: Store, shared: bool) -> None:
    old = started(store)
    store.claim_effect("t1", "quote", old, shared=shared, claim_id="c1")
    store.release_effect("t1", "quote", old, claim_id="c1", shared=shared)
    assert store.effect("t1", "quote", shared=shared) is None
    # Resent after a lost reply: nothing left to drop.
    store.release_effect("t1", "quote", old, claim_id="c1", shared=shared)
    store.release("t1", "w1", old)
    new = store.acquire("t1", "w2", TTL)
    assert store.claim_effect("t1", "quote", new, shared=shared, claim_id="c2").outcome == "claimed"
    with pytest.raises(StaleToken):  # the old driver cannot drop the new one's claim
        store.release_effect("t1", "quote", old, claim_id="c1", shared=shared)
    store.complete_effect("t1", "quote", new, 12, shared=shared)
    with pytest.raises(StaleToken):  # nor can anyone drop a recorded outcome
        store.release_effect("t1", "quote", new, claim_id="c2", shared=shared)
    recorded = store.effect("t1", "quote", shared=shared)
    assert recorded is not None and (recorded.state, recorded.result) == ("done", 12)


def test_a_shared_claim_is_released_only_by_the_claim_that_made_it(store: Store) -> None:
    a = started(store, "a")
    b = started(store, "b")
    assert a == b  # tokens count per thread: equal tokens prove nothing across threads
    store.claim_effect("a", "invoice-7", a, shared=True, claim_id="by-a")
    with pytest.raises(StaleToken):
        store.release_effect("b", "invoice-7", b, claim_id="by-b", shared=True)
    assert store.effect("a", "invoice-7", shared=True).state == "pending"  # type: ignore[union-attr]


def test_shared_effects_span_threads(store: Store) -> None:
    a = started(store, "a")
    b = started(store, "b")
    assert store.claim_effect("a", "invoice-9", a, shared=True).outcome == "claimed"
    store.complete_effect("a", "invoice-9", a, 9, shared=True)
    claim = store.claim_effect("b", "invoice-9", b, shared=True)
    assert (claim.outcome, claim.effect.result) == ("done", 9)
    assert store.effect("b", "invoice-9") is None
    store.delete_thread("a")
    assert store.effect("b", "invoice-9", shared=True) is not None


def test_an_effect_record_names_the_thread_that_claimed_it(store: Store) -> None:
    a = started(store, "a")
    b = started(store, "b")
    store.claim_effect("a", "refund-1", a)
    [own] = store.effects("a")
    assert own.claimed_by == "a"
    # Tokens count per thread, so a shared record's token alone cannot tell whose it is.
    store.claim_effect("a", "invoice-3", a, shared=True, tool="billing.invoice")
    shared = store.effect("b", "invoice-3", shared=True)
    assert shared is not None and (shared.claimed_by, shared.token) == ("a", a)
    store.claim_effect("b", "invoice-3", b, shared=True, takeover=True)
    store.complete_effect("b", "invoice-3", b, "in_3", shared=True)
    shared = store.effect("a", "invoice-3", shared=True)
    assert shared is not None and (shared.claimed_by, shared.state) == ("b", "done")


def test_effects_lists_the_threads_own_records_by_key(store: Store) -> None:
    token = started(store)
    store.claim_effect("t1", "refund-2", token)
    store.claim_effect("t1", "refund-1", token)
    store.complete_effect("t1", "refund-1", token, {"id": "re_1"})
    store.claim_effect("t1", "invoice", token, shared=True)
    store.put_artifact("t1", b"not an effect")
    listed = store.effects("t1")
    assert [(e.key, e.state, e.token, e.result) for e in listed] == [
        ("refund-1", "done", token, {"id": "re_1"}),
        ("refund-2", "pending", token, None),
    ]
    assert store.effects("nobody") == []


def test_an_effect_record_names_its_tool_and_when_it_was_claimed(store: Store) -> None:
    token = started(store)
    before = time.time()
    store.claim_effect("t1", "refund-1", token, tool="payments.refund")
    store.claim_effect("t1", "anonymous", token)
    after = time.time()
    named, anonymous = sorted(store.effects("t1"), key=lambda e: e.key != "refund-1")
    assert named.tool == "payments.refund" and anonymous.tool is None
    assert named.claimed_at is not None and before - 1 <= named.claimed_at <= after + 1
    store.complete_effect("t1", "refund-1", token, "ok")
    done = store.effect("t1", "refund-1")
    assert done is not None and (done.tool, done.claimed_at) == (
        "payments.refund",
        named.claimed_at,
    )


def stuck(store: Store, key: str = "refund-1") -> int:
    """A thread stopped in needs_attention on ``key``, claimed by a worker that died."""
    token = started(store)
    store.claim_effect("t1", key, token, claim_id="c1")
    store.set_status(
        "t1", token, Status.NEEDS_ATTENTION, error="unknown", crashes=1, release_owner="w1"
    )
    return token


def test_a_resolved_result_is_the_records_outcome(store: Store) -> None:
    old = stuck(store)
    meta = store.resolve_effect("t1", "refund-1", result={"id": "re_1"}, start_grace=0)
    # Queued again as reopen queues a thread: its lost workers no longer count.
    assert (meta.status, meta.error, meta.fence, meta.crashes) == (Status.QUEUED, None, old + 1, 0)
    assert "t1" in [thread for thread, _ in store.due()]
    with pytest.raises(StaleToken):  # the dead worker, were it only frozen
        store.complete_effect("t1", "refund-1", old, {"id": "other"})
    new = store.acquire("t1", "w2", TTL)
    claim = store.claim_effect("t1", "refund-1", new)
    assert (claim.outcome, claim.effect.result) == ("done", {"id": "re_1"})


def test_an_effect_resolved_as_not_run_is_claimed_afresh(store: Store) -> None:
    stuck(store)
    store.resolve_effect("t1", "refund-1", did_not_run=True)
    assert store.effects("t1") == []
    new = store.acquire("t1", "w2", TTL)
    assert store.claim_effect("t1", "refund-1", new).outcome == "claimed"


def test_resolving_is_refused_unless_a_person_must_settle_it(store: Store) -> None:
    with pytest.raises(ThreadNotFound):
        store.resolve_effect("nobody", "k", did_not_run=True)
    token = started(store)
    store.claim_effect("t1", "refund-1", token)
    with pytest.raises(LeaseHeld):
        store.resolve_effect("t1", "refund-1", did_not_run=True)
    store.set_status("t1", token, Status.WAITING, release_owner="w1")
    with pytest.raises(ThreadStateError, match="waiting"):
        store.resolve_effect("t1", "refund-1", did_not_run=True)
    store.delete_thread("t1")
    token = stuck(store)
    with pytest.raises(EffectError, match=r"'other' has no record.*agentq effects"):
        store.resolve_effect("t1", "other", result=1)
    for both_or_neither in ({"result": 1, "did_not_run": True}, {}):
        with pytest.raises(InvalidArgument, match="either"):
            store.resolve_effect("t1", "refund-1", **both_or_neither)  # type: ignore[arg-type]
    store.resolve_effect("t1", "refund-1", result=None)
    token = store.acquire("t1", "w2", TTL)
    store.set_status("t1", token, Status.FAILED, error="boom", release_owner="w2")
    with pytest.raises(EffectError, match="already done"):
        store.resolve_effect("t1", "refund-1", did_not_run=True)
    assert store.effect("t1", "refund-1").state == "done"  # type: ignore[union-attr]


def stuck_on_shared(store: Store, key: str = "invoice-1", *, claimant: str = "t1") -> int:
    """Thread t1 stopped in needs_attention on the shared ``key``, which ``claimant``
    claimed; t1's token, after a claimant other than t1 still holds its lease."""
    token = started(store)
    if claimant != "t1":
        other = started(store, claimant, owner="w-other")
        store.claim_effect(claimant, key, other, shared=True, claim_id="c0", tool="billing.invoice")
    else:
        store.claim_effect("t1", key, token, shared=True, claim_id="c1", tool="billing.invoice")
    assert store.claim_effect("t1", key, token, shared=True).outcome == "unknown"
    store.set_status("t1", token, Status.NEEDS_ATTENTION, error="unknown", release_owner="w1")
    return token


def test_a_shared_record_that_stopped_a_thread_is_settled_with_its_result(store: Store) -> None:
    old = stuck_on_shared(store)
    meta = store.resolve_effect("t1", "invoice-1", shared=True, result={"id": "in_1"})
    assert (meta.status, meta.error, meta.fence) == (Status.QUEUED, None, old + 1)
    assert store.effect("t1", "invoice-1") is None  # the thread's own records stay as they were
    settled = store.effect("t1", "invoice-1", shared=True)
    assert settled is not None
    assert (settled.state, settled.result, settled.token, settled.claimed_by) == (
        "done",
        {"id": "in_1"},
        old + 1,
        "t1",
    )
    with pytest.raises(StaleToken):  # the dead worker, were it only frozen
        store.complete_effect("t1", "invoice-1", old, {"id": "other"}, shared=True)
    token = store.acquire("t1", "w2", TTL)
    claim = store.claim_effect("t1", "invoice-1", token, shared=True)
    assert (claim.outcome, claim.effect.result) == ("done", {"id": "in_1"})
    # Settled once, it is not settled again: a second settling is refused, changes nothing.
    store.set_status("t1", token, Status.FAILED, error="boom", release_owner="w2")
    with pytest.raises(EffectError, match=r"already done.*agentq retry t1"):
        store.resolve_effect("t1", "invoice-1", shared=True, did_not_run=True)
    assert store.effect("t1", "invoice-1", shared=True) == settled


def test_a_shared_record_settled_as_not_run_is_claimed_afresh(store: Store) -> None:
    stuck_on_shared(store)
    store.resolve_effect("t1", "invoice-1", shared=True, did_not_run=True)
    assert store.effect("t1", "invoice-1", shared=True) is None
    token = store.acquire("t1", "w2", TTL)
    assert store.claim_effect("t1", "invoice-1", token, shared=True).outcome == "claimed"


def test_a_shared_record_taken_over_is_completed_only_by_the_thread_holding_it(
    store: Store,
) -> None:
    """Tokens count per thread, so a shared key's two claimants can hold the same number:
    the one that was taken over must not record its result over the other's claim."""
    first, second = started(store, "a"), started(store, "b")
    assert first == second
    store.claim_effect("a", "invoice-7", first, shared=True)
    store.claim_effect("b", "invoice-7", second, shared=True, takeover=True)
    with pytest.raises(StaleToken):
        store.complete_effect("a", "invoice-7", first, {"by": "a"}, shared=True)
    store.complete_effect("b", "invoice-7", second, {"by": "b"}, shared=True)
    store.complete_effect("b", "invoice-7", second, {"by": "b"}, shared=True)  # resent
    effect = store.effect("b", "invoice-7", shared=True)
    assert effect is not None and effect.result == {"by": "b"}


def test_a_shared_record_is_not_settled_while_the_thread_that_claimed_it_runs(
    store: Store,
) -> None:
    stuck_on_shared(store, claimant="src")
    before = store.effect("t1", "invoice-1", shared=True)
    assert before is not None and before.claimed_by == "src"
    with pytest.raises(LeaseHeld, match=r"claimed by thread 'src'.*agentq retry t1") as held:
        store.resolve_effect("t1", "invoice-1", shared=True, did_not_run=True)
    assert held.value.thread_id == "t1" and held.value.ttl_ms > 0
    assert store.effect("t1", "invoice-1", shared=True) == before
    meta = store.meta("t1")
    assert meta is not None and meta.status == Status.NEEDS_ATTENTION
    # Its claimant records it after all: nothing to settle, t1 gets the result on a retry.
    token = store.meta("src").fence  # type: ignore[union-attr]
    store.complete_effect("src", "invoice-1", token, "in_1", shared=True)
    with pytest.raises(EffectError, match=r"'invoice-1' is already done.*agentq retry t1"):
        store.resolve_effect("t1", "invoice-1", shared=True, result="in_2")
    assert store.effect("t1", "invoice-1", shared=True).result == "in_1"  # type: ignore[union-attr]


def test_a_shared_record_whose_claimant_died_is_settled_from_a_thread_it_stopped(
    store: Store,
) -> None:
    stuck_on_shared(store, claimant="src")
    token = store.meta("src").fence  # type: ignore[union-attr]
    store.release("src", "w-other", token)
    store.resolve_effect("t1", "invoice-1", shared=True, result="in_1")
    with pytest.raises(StaleToken):  # src's worker, were it only frozen
        store.complete_effect("src", "invoice-1", token, "in_other", shared=True)
    assert store.effect("src", "invoice-1", shared=True).result == "in_1"  # type: ignore[union-attr]


def test_settling_a_shared_record_is_refused_unless_a_person_must(store: Store) -> None:
    token = started(store)
    store.claim_effect("t1", "invoice-1", token, shared=True)
    with pytest.raises(LeaseHeld, match="holds this thread's lease"):
        store.resolve_effect("t1", "invoice-1", shared=True, did_not_run=True)
    store.set_status("t1", token, Status.WAITING, release_owner="w1")
    with pytest.raises(ThreadStateError, match="waiting"):
        store.resolve_effect("t1", "invoice-1", shared=True, did_not_run=True)
    assert store.effect("t1", "invoice-1", shared=True).state == "pending"  # type: ignore[union-attr]
    store.delete_thread("t1")
    with pytest.raises(ThreadNotFound):
        store.resolve_effect("t1", "invoice-1", shared=True, did_not_run=True)
    stuck_on_shared(store, "invoice-2")
    with pytest.raises(EffectError, match=r"shared effect 'other' has no record.*agentq retry t1"):
        store.resolve_effect("t1", "other", shared=True, did_not_run=True)
    # Asked for as the thread's own, a shared key's record is not found: the error says why.
    with pytest.raises(EffectError, match=r"'invoice-2' has no record.*shared=True"):
        store.resolve_effect("t1", "invoice-2", did_not_run=True)
    assert store.effect("t1", "invoice-2", shared=True).state == "pending"  # type: ignore[union-attr]


# -- recovery index ----------------------------------------------------------------------


def test_claim_due_holds_entries_off(store: Store) -> None:
    store.open_thread("t1", task="agent", start_grace=0)
    store.open_thread("t2", task="agent", start_grace=3600)
    assert store.claim_due(hold=3600) == ["t1"]
    assert store.claim_due(hold=3600) == []
    assert store.due() == []


def test_unclaim_due_brings_claimed_entries_back_and_leaves_the_rest(store: Store) -> None:
    for thread_id in ("t1", "t2", "t3"):
        store.open_thread(thread_id, task="agent", start_grace=0)
    assert store.claim_due(hold=3600) == ["t1", "t2", "t3"]
    token = store.acquire("t3", "w1", 30)
    store.set_status("t3", token, Status.DONE, release_owner="w1")  # left the index since
    store.unclaim_due(["t2", "t3"])
    assert [thread_id for thread_id, _ in store.due()] == ["t2"]
    assert store.claim_due(hold=3600) == ["t2"]


def test_defer_due_spaces_out_a_queued_thread_no_worker_took(store: Store) -> None:
    for thread_id in ("t1", "t2", "t3", "t4"):
        store.open_thread(thread_id, task="agent", start_grace=0)
    assert store.claim_due(hold=0) == ["t1", "t2", "t3", "t4"]  # sent, and due again at once
    queued_at = max(meta.updated_at for meta in map(store.meta, ["t1", "t4"]) if meta)
    while time.time() - queued_at <= 1.0:
        time.sleep(0.01)
    store.defer_due("t1", 0, 0.2)  # queued over two holds: due after as long, 1 s or more
    store.acquire("t2", "w1", 3600)  # a worker took it since it was sent
    store.defer_due("t2", 0, 0.05)
    store.defer_due("t3", 0, 3600)  # queued for less than two holds
    store.defer_due("t4", 0, 0.02)  # the same, but capped at 16 holds: 0.32 s
    assert "t1" not in dict(store.due())
    poll = time.monotonic()
    while len(due := dict(store.due())) < 3:
        assert time.monotonic() - poll < 10, f"t1 and t4 did not come due again: {due}"
        time.sleep(0.01)
    # t1 due after as long as it was queued (over 1 s), t4 after its cap; t2 not at all.
    assert set(due) == {"t1", "t3", "t4"} and due["t4"] < due["t1"]


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", "a{b", "a}b", "tab\there", "x" * 201, 42, None])
def test_invalid_thread_ids_are_refused(store: Store, bad: object) -> None:
    before = snapshot(store)
    for call in (
        lambda: store.open_thread(bad, task="agent"),  # type: ignore[arg-type]
        lambda: store.meta(bad),  # type: ignore[arg-type]
        lambda: store.latest(bad),  # type: ignore[arg-type]
        lambda: store.acquire(bad, "w1", TTL),  # type: ignore[arg-type]
        lambda: store.delete_thread(bad),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidThreadId):
            call()
    assert snapshot(store) == before


def test_unserializable_state_names_the_path_and_writes_nothing(store: Store) -> None:
    token = started(store)
    store.commit("t1", token, cp(0, token, ok=1))
    before = snapshot(store)
    bad = cp(1, token, messages=[{"content": "a"}, {"content": object()}])
    with pytest.raises(UnserializableState) as info:
        store.commit("t1", token, bad)
    assert info.value.path == "state.messages[1].content"
    assert "'t1'" in str(info.value) and "step 1" in str(info.value)
    assert snapshot(store) == before


def test_oversized_checkpoint_is_refused_before_writing(store: Store) -> None:
    token = started(store)
    store.max_checkpoint_bytes = 1000
    before = snapshot(store)
    with pytest.raises(CheckpointTooLarge) as info:
        store.commit("t1", token, cp(0, token, text="x" * 2000))
    assert "artifacts" in str(info.value) and info.value.limit == 1000
    assert snapshot(store) == before


def test_corrupt_checkpoint_is_refused_and_the_previous_one_still_loads(store: Store) -> None:
    token = started(store)
    store.commit("t1", token, cp(0, token, n=0))
    store.commit("t1", token, cp(1, token, n=1))
    overwrite_checkpoint(store, "t1", 1, b"\xc1 not msgpack")
    before = snapshot(store)
    with pytest.raises(CorruptCheckpoint) as info:
        store.latest("t1")
    assert info.value.step == 1 and info.value.thread_id == "t1"
    assert snapshot(store) == before  # reading it repaired or removed nothing
    assert store.checkpoint("t1", 0).state == {"n": 0}
    overwrite_checkpoint(store, "t1", 1, msgpack.packb([1, 2]))
    with pytest.raises(CorruptCheckpoint):
        store.checkpoint("t1", 1)


def test_future_format_version_is_refused_and_the_previous_one_still_loads(
    store: Store,
) -> None:
    token = started(store)
    store.commit("t1", token, cp(0, token, n=0))
    store.commit("t1", token, cp(1, token, n=1))
    overwrite_checkpoint(store, "t1", 1, msgpack.packb({"v": 99, "step": 1}))
    before = snapshot(store)
    with pytest.raises(UnsupportedVersion, match="upgrade agentq"):
        store.latest("t1")
    assert snapshot(store) == before
    assert store.checkpoint("t1", 0).state == {"n": 0}


def test_a_future_version_that_stores_a_new_value_type_asks_for_an_upgrade(
    store: Store,
) -> None:
    """A newer agentq may store a type this one has no ext code for: its checkpoints are
    newer, not damaged, and must not send the operator to restore a backup or fork."""
    token = started(store)
    store.commit("t1", token, cp(0, token, n=0))
    store.commit("t1", token, cp(1, token, n=1))
    newer = {"v": 99, "step": 1, "state": {"price": msgpack.ExtType(42, b"9.99")}}
    overwrite_checkpoint(store, "t1", 1, msgpack.packb(newer))
    before = snapshot(store)
    with pytest.raises(UnsupportedVersion, match="upgrade agentq") as info:
        store.latest("t1")
    assert (info.value.thread_id, info.value.step) == ("t1", 1)
    assert snapshot(store) == before
    assert store.checkpoint("t1", 0).state == {"n": 0}
    # An unknown value type in a checkpoint of this version is damage, as before.
    overwrite_checkpoint(store, "t1", 1, msgpack.packb({**newer, "v": 1}))
    with pytest.raises(CorruptCheckpoint):
        store.latest("t1")


# -- control from outside the driver -----------------------------------------------------


def test_reopen_queues_a_waiting_thread_with_its_resume_value(store: Store) -> None:
    token = started(store)
    store.set_status("t1", token, Status.WAITING, interrupt={"ask": "refund?"}, release_owner="w1")
    meta = store.reopen(
        "t1", from_statuses={Status.WAITING}, resume_value={"ok": True}, start_grace=0
    )
    assert (meta.status, meta.resume_value, meta.interrupt) == (Status.QUEUED, {"ok": True}, None)
    assert [t for t, _ in store.due()] == ["t1"]
    new = store.acquire("t1", "w2", TTL)
    store.commit("t1", new, cp(0, new))
    assert store.meta("t1").resume_value is None  # type: ignore[union-attr]


def test_a_resume_value_that_cannot_be_stored_is_refused_naming_it(store: Store) -> None:
    """Every backend says the same: what could not be stored, of which thread; and the
    thread keeps waiting on its question, its fence where it was."""
    token = started(store)
    store.set_status("t1", token, Status.WAITING, interrupt={"ask": "refund?"}, release_owner="w1")
    before = snapshot(store)
    with pytest.raises(UnserializableState, match=r"^thread 't1': resume value: object cannot"):
        store.reopen("t1", from_statuses={Status.WAITING}, resume_value=object())
    assert snapshot(store) == before


@pytest.mark.parametrize("control", ["resume", "cancel"])
def test_a_status_write_sent_again_after_a_resume_or_a_cancel_is_refused(
    store: Store, control: str
) -> None:
    """The driver's pause, its reply lost and sent again after a person resumed or
    cancelled the thread, does not put the thread back to waiting."""
    token = started(store)
    pause = {"interrupt": {"ask": "refund?"}, "release_owner": "w1"}
    store.set_status("t1", token, Status.WAITING, **pause)
    if control == "resume":
        store.reopen("t1", from_statuses={Status.WAITING}, resume_value=True, start_grace=0)
    else:
        assert store.request_cancel("t1") == Status.CANCELLED
    before = snapshot(store)
    with pytest.raises(StaleToken):
        store.set_status("t1", token, Status.WAITING, **pause)
    assert snapshot(store) == before
    meta = store.meta("t1")
    assert meta is not None
    assert meta.status == (Status.QUEUED if control == "resume" else Status.CANCELLED)


def test_take_canvas_names_one_taker_and_answers_it_again(store: Store) -> None:
    started(store)
    assert store.take_canvas("t1", "task-a")
    assert store.take_canvas("t1", "task-a")  # asked again: a redelivery, a lost reply
    assert not store.take_canvas("t1", "task-b")
    assert not store.take_canvas("nobody", "task-a")
    assert store.meta("nobody") is None


def test_reopen_refuses_other_statuses_and_unknown_threads(store: Store) -> None:
    started(store)
    before = snapshot(store)
    with pytest.raises(ThreadStateError) as info:
        store.reopen("t1", from_statuses={Status.WAITING, Status.FAILED})
    assert info.value.status == "running"
    # What it may be reopened from, and the way out: the same words on every backend.
    told = str(info.value)
    assert "status 'running' (only from ['failed', 'waiting'])" in told, told
    assert "'agentq fork t1 --from N' (store.fork in code)" in told, told
    assert snapshot(store) == before
    with pytest.raises(ThreadNotFound):
        store.reopen("nobody", from_statuses={Status.WAITING})


def test_reopen_clears_a_failure_and_marks_the_thread_sent_on_by_a_person(store: Store) -> None:
    token = started(store)
    assert not store.meta("t1").reopened  # type: ignore[union-attr]
    store.set_status("t1", token, Status.FAILED, error="boom", attempts=3, release_owner="w1")
    meta = store.reopen("t1", from_statuses={Status.FAILED})
    assert (meta.status, meta.error, meta.attempts) == (Status.QUEUED, None, 0)
    assert meta.reopened and store.meta("t1").reopened  # type: ignore[union-attr]


def test_cancel_flags_a_running_thread_for_its_driver(store: Store) -> None:
    token = started(store)
    assert not store.commit("t1", token, cp(0, token))
    assert store.request_cancel("t1") == Status.RUNNING
    assert store.meta("t1").cancel_requested  # type: ignore[union-attr]
    assert store.commit("t1", token, cp(1, token))


def test_cancel_stops_at_once_a_running_thread_whose_lease_ran_out(store: Store) -> None:
    """Its worker died and no worker will take it (its task is unknown to them): nobody is
    left to see a flag, so the cancel must not wait for a driver."""
    store.open_thread("t1", task="renamed_agent", start_grace=0)
    token = store.acquire("t1", "w1", 0.2)
    assert not store.commit("t1", token, cp(0, token))
    wait_until(lambda: store.schedules(["t1"])[0].owner is None, timeout=10, what="the lease out")
    assert store.request_cancel("t1") == Status.CANCELLED
    meta = store.meta("t1")
    assert meta is not None and meta.status == Status.CANCELLED and meta.fence > token
    assert store.due() == []
    with pytest.raises(StaleToken):
        store.commit("t1", token, cp(1, token))


def test_cancel_stops_an_idle_thread_at_once(store: Store) -> None:
    store.open_thread("t1", task="agent", start_grace=0)
    assert store.request_cancel("t1") == Status.CANCELLED
    assert store.due() == []
    assert store.request_cancel("t1") == Status.CANCELLED
    with pytest.raises(ThreadNotFound):
        store.request_cancel("nobody")


def test_artifacts_are_content_addressed_and_deleted_with_the_thread(store: Store) -> None:
    started(store)
    digest = store.put_artifact("t1", b"%PDF-1.7 ...")
    assert store.put_artifact("t1", b"%PDF-1.7 ...") == digest
    assert store.get_artifact("t1", digest) == b"%PDF-1.7 ..."
    with pytest.raises(ArtifactNotFound):
        store.get_artifact("t1", "0" * 64)
    store.delete_thread("t1")
    with pytest.raises(ArtifactNotFound):
        store.get_artifact("t1", digest)


def test_an_artifact_of_a_deleted_thread_is_refused_and_leaves_nothing(store: Store) -> None:
    """A node still running after gc deleted its thread must not leave bytes nothing owns."""
    started(store)
    store.delete_thread("t1")
    before = snapshot(store)
    with pytest.raises(ThreadNotFound, match="nothing was stored"):
        store.put_artifact("t1", b"%PDF-1.7 ...")
    assert snapshot(store) == before


def test_a_fork_keeps_the_artifacts_its_checkpoint_refers_to(store: Store) -> None:
    empty = snapshot(store)
    token = started(store)
    digest = store.put_artifact("t1", b"%PDF-1.7 ...")
    ref = {"artifact": digest, "size": 12, "content_type": "application/pdf"}
    store.claim_effect("t1", "charge", token)
    store.commit("t1", token, cp(0, token, doc=ref))
    store.fork("t1", 0, "t2")
    assert store.latest("t2").state["doc"] == ref  # type: ignore[union-attr]
    assert store.get_artifact("t2", digest) == b"%PDF-1.7 ..."
    assert store.effect("t2", "charge") is None
    store.delete_thread("t1")
    assert store.get_artifact("t2", digest) == b"%PDF-1.7 ..."
    store.delete_thread("t2")
    assert snapshot(store) == empty


def test_commit_can_pause_for_a_human(store: Store) -> None:
    token = started(store)
    store.commit(
        "t1",
        token,
        cp(0, token),
        status=Status.WAITING,
        interrupt={"ask": "approve refund?"},
        release_owner="w1",
    )
    meta = store.meta("t1")
    assert meta is not None
    assert (meta.status, meta.step) == (Status.WAITING, 0)
    assert meta.interrupt == {"ask": "approve refund?"}
    assert store.due() == []


@pytest.mark.parametrize("ttl", [0, -1, 0.0001])
def test_a_lease_ttl_that_expires_at_once_is_refused(store: Store, ttl: float) -> None:
    token = started(store)
    before = snapshot(store)
    with pytest.raises(InvalidArgument):
        store.acquire("t1", "w1", ttl)
    with pytest.raises(InvalidArgument):
        store.renew("t1", "w1", token, ttl)
    assert snapshot(store) == before


def test_a_resent_commit_or_completion_is_recognised_as_done(store: Store) -> None:
    """What a client does when a reply is lost after the write was applied."""
    token = started(store)
    checkpoint = cp(0, token, n=1)
    store.commit("t1", token, checkpoint)
    store.commit("t1", token, checkpoint)
    with pytest.raises(StepConflict):
        store.commit("t1", token, cp(0, token, n="different"))
    store.claim_effect("t1", "k", token)
    store.complete_effect("t1", "k", token, "ok")
    store.complete_effect("t1", "k", token, "ok")
    with pytest.raises(StaleToken):
        store.complete_effect("t1", "k", token, "other")


def test_one_sweeper_at_a_time(store: Store) -> None:
    assert store.lease_sweeper("w1", 30)
    assert store.lease_sweeper("w1", 30)
    assert not store.lease_sweeper("w2", 30)
    assert store.lease_sweeper("w1", 0.05)
    wait_until(lambda: store.lease_sweeper("w2", 30), timeout=5, what="sweeper lease expiry")
    assert not store.lease_sweeper("w1", 30)


# -- append-only logs --------------------------------------------------------------------


def commit_messages(
    store: Store, token: int, step: int, messages: list[object], before: int
) -> None:
    store.commit(
        "t1", token, cp(step, token, messages=messages, turn=step), logs={"messages": before}
    )


def test_append_only_field_is_rebuilt_for_every_checkpoint(store: Store) -> None:
    token = started(store)
    messages: list[object] = []
    for step in range(4):
        before = len(messages)
        messages = [*messages, {"role": "user", "n": step}, ("tuple", step)]
        commit_messages(store, token, step, messages, before)
    assert store.latest("t1").state == {"messages": messages, "turn": 3}  # type: ignore[union-attr]
    assert store.checkpoint("t1", 1).state["messages"] == messages[:4]
    assert [len(c.state["messages"]) for c in store.history("t1")] == [8, 6, 4, 2]


def test_snapshots_do_not_grow_with_an_append_only_field(store: Store) -> None:
    token = started(store)
    messages: list[object] = []
    for step in range(3):
        before = len(messages)
        messages = messages + [{"content": "x" * 500}] * 10
        commit_messages(store, token, step, messages, before)
    # the envelope holds the field's length, not its items
    from agentq.codec.envelope import encode_checkpoint

    latest = store.latest("t1")
    assert latest is not None
    rest = encode_checkpoint("t1", latest, logs={"messages": len(messages)})
    assert len(rest.snapshot) < 300 and rest.appended == {"messages": []}


def test_a_log_that_does_not_end_where_the_commit_continues_is_refused(store: Store) -> None:
    token = started(store)
    commit_messages(store, token, 0, ["a", "b"], 0)
    before = snapshot(store)
    with pytest.raises(LogConflict):
        commit_messages(store, token, 1, ["a", "b", "c"], 1)
    assert snapshot(store) == before
    commit_messages(store, token, 1, ["a", "b", "c"], 2)
    assert store.latest("t1").state["messages"] == ["a", "b", "c"]  # type: ignore[union-attr]


@pytest.mark.parametrize("long", [False, True], ids=["short", "2500 items"])
def test_a_conflict_in_a_later_log_leaves_every_log_as_it_was(store: Store, long: bool) -> None:
    """The first log's items, however many, and a log the refused commit would have
    created go again with the refusal."""
    token = started(store)
    store.commit("t1", token, cp(0, token, a=["a0"], b=["b0", "b1"]), logs={"a": 0, "b": 0})
    before = snapshot(store)
    grown = ["a0", *(f"a{i}" for i in range(1, 2501 if long else 3))]
    with pytest.raises(LogConflict):
        store.commit(
            "t1",
            token,
            cp(1, token, a=grown, b=["b0", "b1", "b2"], c=["c0"]),
            logs={"a": 1, "b": 1, "c": 0},
        )
    assert snapshot(store) == before
    store.commit(
        "t1",
        token,
        cp(1, token, a=grown, b=["b0", "b1", "b2"], c=["c0"]),
        logs={"a": 1, "b": 2, "c": 0},
    )
    latest = store.latest("t1")
    assert latest is not None
    assert latest.state["a"] == grown and latest.state["c"] == ["c0"]


def test_fork_and_delete_cover_the_logs(store: Store) -> None:
    empty = snapshot(store)
    token = started(store)
    commit_messages(store, token, 0, ["a"], 0)
    commit_messages(store, token, 1, ["a", "b"], 1)
    store.fork("t1", 0, "t2")
    assert store.latest("t2").state["messages"] == ["a"]  # type: ignore[union-attr]
    new = store.acquire("t2", "w2", TTL)
    store.commit("t2", new, cp(1, new, messages=["a", "z"]), logs={"messages": 1})
    assert store.latest("t1").state["messages"] == ["a", "b"]  # type: ignore[union-attr]
    assert store.latest("t2").state["messages"] == ["a", "z"]  # type: ignore[union-attr]
    store.delete_thread("t2")
    store.delete_thread("t1")
    assert snapshot(store) == empty


def test_a_resent_claim_is_still_ours(store: Store) -> None:
    """What a client does when a claim's reply is lost after the claim was made."""
    token = started(store)
    assert store.claim_effect("t1", "k", token, claim_id="call-a").outcome == "claimed"
    assert store.claim_effect("t1", "k", token, claim_id="call-a").outcome == "claimed"
    assert store.claim_effect("t1", "k", token, claim_id="call-b").outcome == "unknown"
    assert store.claim_effect("t1", "k", token).outcome == "unknown"
    store.release("t1", "w1", token)
    newer = store.acquire("t1", "w2", TTL)
    # the same id under another token is a new driver, not a resend
    assert store.claim_effect("t1", "k", newer, claim_id="call-a").outcome == "unknown"
