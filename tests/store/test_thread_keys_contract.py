"""Concurrency keys, the same on every backend: at most cap threads hold a key's slots,
the others wait parked in arrival order, slots die with their lease."""

from __future__ import annotations

import pytest

from agentq import Status
from agentq.errors import LimitError, StaleToken, StoreConfigError, ThreadStateError
from agentq.store.contract import Store
from agentq.store.contract.thread_keys import CANCEL_REQUESTED
from tests.support.redis_server import wait_until

TTL = 30.0


@pytest.fixture
def keys_store(store: Store) -> Store:
    if getattr(store, "cluster", False):
        pytest.skip("concurrency keys need a single Redis server")
    return store


def _leased(store: Store, thread_id: str, ttl: float = TTL) -> int:
    store.open_thread(thread_id, task="t", start_grace=60)
    return store.acquire(thread_id, f"owner-{thread_id}", ttl)


def _enter(store: Store, thread_id: str, cap: int = 1, ttl: float = TTL) -> int:
    token = _leased(store, thread_id, ttl)
    return store.enter_key(thread_id, f"owner-{thread_id}", token, "tenant:1", cap)


def _state(store: Store) -> tuple[list[str], list[str]]:
    (state,) = store.key_states()
    return state.running, [waiter.thread_id for waiter in state.waiting]


def test_a_full_key_parks_the_thread_queued_without_a_due_time_or_lease(
    keys_store: Store,
) -> None:
    store = keys_store
    assert _enter(store, "a", cap=2) == 0
    assert _enter(store, "b", cap=2) == 0
    assert _enter(store, "c", cap=2) == 1
    meta = store.meta("c")
    assert meta is not None and meta.status == Status.QUEUED
    (schedule,) = store.schedules(["c"])
    assert schedule.due_at is None and schedule.owner is None
    assert _state(store) == (["a", "b"], ["c"])
    (state,) = store.key_states()
    assert state.cap == 2 and state.waiting[0].position == 1 and state.waiting[0].since > 0


def test_waiters_start_in_arrival_order_and_a_newcomer_does_not_jump_a_woken_one(
    keys_store: Store,
) -> None:
    store = keys_store
    token = _leased(store, "first")
    assert store.enter_key("first", "owner-first", token, "tenant:1", 1) == 0
    assert [_enter(store, name) for name in ("w1", "w2", "w3")] == [1, 2, 3]
    assert store.leave_key("first", token, "tenant:1", start_grace=5) == ["w1"]
    (schedule,) = store.schedules(["w1"])
    assert schedule.due_at is not None  # recovery sends it if its message is lost
    assert _enter(store, "late") == 3  # w1's slot is reserved for it
    token = store.acquire("w1", "owner-w1", TTL)
    assert store.enter_key("w1", "owner-w1", token, "tenant:1", 1) == 0
    assert store.leave_key("w1", token, "tenant:1", start_grace=5) == ["w2"]
    assert _state(store) == (["w2"], ["w3", "late"])


def test_a_thread_leaving_under_a_raised_cap_wakes_as_many_waiters_as_it_allows(
    keys_store: Store,
) -> None:
    """A deploy raised the key's cap from 1 to 3 while threads waited under the old one:
    the thread leaving, under the new declarations, wakes three rather than one, whose
    two slots would otherwise stay idle until the next sweep."""
    store = keys_store
    token = _leased(store, "a")
    assert store.enter_key("a", "owner-a", token, "tenant:1", 1) == 0
    assert [_enter(store, name) for name in ("b", "c", "d", "e")] == [1, 2, 3, 4]
    with pytest.raises(LimitError, match="needs a cap of at least 1 thread, got 0"):
        store.leave_key("a", token, "tenant:1", start_grace=5, cap=0)
    assert store.leave_key("a", token, "tenant:1", start_grace=5, cap=3) == ["b", "c", "d"]
    (state,) = store.key_states()
    assert state.cap == 3 and [waiter.thread_id for waiter in state.waiting] == ["e"]


def test_a_parked_thread_sent_again_keeps_its_place(keys_store: Store) -> None:
    store = keys_store
    assert [_enter(store, name) for name in ("a", "b", "c")] == [0, 1, 2]
    token = store.acquire("b", "owner-b", TTL)
    assert store.enter_key("b", "owner-b", token, "tenant:1", 1) == 1
    assert _state(store) == (["a"], ["b", "c"])


def test_a_slot_dies_with_its_lease_and_the_sweep_wakes_the_next(keys_store: Store) -> None:
    store = keys_store
    assert _enter(store, "dies", ttl=0.2) == 0
    assert _enter(store, "next") == 1
    woken: list[str] = []
    wait_until(lambda: woken.extend(store.wake_keys()) or woken, timeout=5, what="the wake")
    assert woken == ["next"]
    assert dict(store.due(limit=10)).keys() >= {"next"}
    assert _state(store) == (["next"], [])


def test_only_the_owning_token_gives_a_slot_back(keys_store: Store) -> None:
    store = keys_store
    token = _leased(store, "a")
    assert store.enter_key("a", "owner-a", token, "tenant:1", 1) == 0
    assert _enter(store, "b") == 1
    assert store.leave_key("a", token - 1, "tenant:1", start_grace=5) == []
    assert _state(store) == (["a"], ["b"])


def test_cancelling_a_parked_thread_takes_it_out_of_the_queue(keys_store: Store) -> None:
    store = keys_store
    token = _leased(store, "a")
    store.enter_key("a", "owner-a", token, "tenant:1", 1)
    assert [_enter(store, name) for name in ("b", "c")] == [1, 2]
    assert store.request_cancel("b") == Status.CANCELLED
    assert _state(store) == (["a"], ["c"])
    assert store.leave_key("a", token, "tenant:1", start_grace=5) == ["c"]


def test_deleting_a_parked_thread_takes_it_out_of_the_queue(keys_store: Store) -> None:
    store = keys_store
    assert [_enter(store, name) for name in ("a", "b")] == [0, 1]
    assert store.delete_thread("b")
    assert _state(store) == (["a"], [])


def test_a_stale_token_cannot_enter(keys_store: Store) -> None:
    store = keys_store
    token = _leased(store, "a")
    store.acquire("a", "owner-a", TTL)
    with pytest.raises(StaleToken):
        store.enter_key("a", "owner-a", token, "tenant:1", 1)


def test_each_entry_counts_as_a_take_of_the_key(keys_store: Store) -> None:
    store = keys_store
    assert [_enter(store, name) for name in ("a", "b")] == [0, 1]
    assert store.limit_takes() == {"tenant:1": 2}  # what doctor judges a limit used by


def test_a_key_only_threads_entered_is_a_limit_state_once_idle(keys_store: Store) -> None:
    """``agentq limits`` lists a family's keys from the limit states and the running
    keys: once its threads are gone, a key only threads ran under was still listed on
    Redis, which counts the entries in the key's state, and no longer on SQLite."""
    store = keys_store
    token = _leased(store, "a")
    assert store.enter_key("a", "owner-a", token, "tenant:1", 1) == 0
    store.set_status("a", token, Status.DONE, release_owner="owner-a")
    assert store.leave_key("a", token, "tenant:1", start_grace=5) == []
    assert store.key_states() == []
    state = store.limit_states()["tenant:1"]
    assert (state.req_tat, state.tok_tat, state.paused, state.in_flight) == (0, 0, 0, 0)


@pytest.mark.parametrize("stopped", [Status.CANCELLED, Status.DONE, Status.WAITING])
def test_a_thread_that_stopped_is_not_parked(keys_store: Store, stopped: Status) -> None:
    store = keys_store
    assert _enter(store, "a") == 0
    token = _leased(store, "b")
    store.set_status("b", token, stopped)  # since its driver read it, before the key
    with pytest.raises(ThreadStateError, match=f"the thread is {stopped.value}"):
        store.enter_key("b", "owner-b", token, "tenant:1", 1)
    meta = store.meta("b")
    assert meta is not None and meta.status == stopped
    assert _state(store) == (["a"], [])


@pytest.mark.parametrize("full", [True, False])
def test_a_thread_asked_to_cancel_since_its_lease_was_taken_is_neither_parked_nor_seated(
    keys_store: Store, full: bool
) -> None:
    """``cancel()`` only flags a thread that runs under a lease: entering the key then
    leaves it running under its lease, for its driver to cancel, rather than park it
    with the flag (where it would wait for its turn) or let it take a slot."""
    store = keys_store
    if full:
        assert _enter(store, "a") == 0
    token = _leased(store, "b")
    assert store.request_cancel("b") == Status.RUNNING
    assert store.enter_key("b", "owner-b", token, "tenant:1", 1) == CANCEL_REQUESTED
    meta = store.meta("b")
    assert meta is not None and meta.status == Status.RUNNING and meta.cancel_requested
    assert store.schedules(["b"])[0].owner == "owner-b"
    if full:
        assert _state(store) == (["a"], [])  # b neither waits nor holds a slot
        assert store.limit_takes() == {"tenant:1": 1}  # a's entry only
    else:
        assert store.key_states() == [] and store.limit_takes() == {}


def test_a_woken_thread_asked_to_cancel_before_it_entered_frees_its_reserved_slot(
    keys_store: Store,
) -> None:
    store = keys_store
    token = _leased(store, "a")
    assert store.enter_key("a", "owner-a", token, "tenant:1", 1) == 0
    assert [_enter(store, name) for name in ("b", "c")] == [1, 2]
    assert store.leave_key("a", token, "tenant:1", start_grace=5) == ["b"]
    token = store.acquire("b", "owner-b", TTL)
    assert store.request_cancel("b") == Status.RUNNING
    assert store.enter_key("b", "owner-b", token, "tenant:1", 1) == CANCEL_REQUESTED
    # What its driver then does, as for a cancel it read when it took the lease.
    store.set_status("b", token, Status.CANCELLED, release_owner="owner-b")
    assert store.leave_key("b", token, "tenant:1", start_grace=5) == ["c"]
    assert _state(store) == (["c"], [])


@pytest.mark.parametrize("cap", [0, -1, 1.5, True])
def test_a_cap_below_one_is_refused(keys_store: Store, cap: object) -> None:
    token = _leased(keys_store, "a")
    with pytest.raises(LimitError, match="at least 1"):
        keys_store.enter_key("a", "owner-a", token, "tenant:1", cap)  # type: ignore[arg-type]


def test_redis_cluster_refuses_concurrency_keys_and_finds_none(store: Store) -> None:
    if not getattr(store, "cluster", False):
        pytest.skip("a Redis Cluster refusal")
    token = _leased(store, "a")
    with pytest.raises(StoreConfigError, match="single Redis server"):
        store.enter_key("a", "owner-a", token, "tenant:1", 1)
    assert store.wake_keys() == [] and store.key_states() == []
