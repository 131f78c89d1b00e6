"""Concurrency keys with real worker processes, on each store: a key's cap holds across
processes, the waiting threads start in arrival order, a killed worker's slot comes back
with its lease and starts the next waiter, a cancelled waiter leaves the queue, a crashed
thread is counted as crashed before a full key parks it, a woken thread cancelled before
its first step starts the next waiter, and so does a parked thread whose first task was
revoked, cancelled when woken rather than run."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

import agentq
from agentq import Status
from agentq.celery.task import KEY_HEADER
from agentq.celery.task_outcome import WAITING_FOR_KEY
from agentq.errors import LimitError
from agentq.store import open_store
from tests.support.keyed_app import make_keyed_app
from tests.support.redis_server import RedisServer, wait_until
from tests.support.workers import WorkerProcess

LEASE_TTL = 2.0
SLOW_SWEEP = 600.0
"""A sweep interval no test outlasts: what happens, the leaving threads did."""


class Setup:
    def __init__(self, broker: str, server: RedisServer, store: str, backend: str) -> None:
        self.prefix = f"key{uuid.uuid4().hex[:8]}:"
        self.ns = self.prefix.rstrip(":")
        self.env = {
            "AGENTQ_TEST_BROKER": broker,
            "AGENTQ_TEST_STORE": store,
            "AGENTQ_TEST_LEDGER": server.url,
            "AGENTQ_TEST_PREFIX": self.prefix,
            "AGENTQ_TEST_QUEUE": f"agentq-keys-{self.prefix}",
            "AGENTQ_TEST_LEASE_TTL": str(LEASE_TTL),
            "AGENTQ_TEST_BACKEND": backend,
        }
        self.app: Celery = make_keyed_app(
            broker=broker,
            store=store,
            ledger=server.url,
            prefix=self.prefix,
            queue=self.env["AGENTQ_TEST_QUEUE"],
            backend=backend,
            lease_ttl=LEASE_TTL,
        )
        self.agent: Any = self.app.tasks["tests.keyed_agent"]
        self.ledger = redis.Redis.from_url(server.url)
        self.store = open_store(store, prefix=self.prefix)

    def started(self) -> list[str]:
        return [each.decode() for each in self.ledger.lrange(f"{self.ns}:started", 0, -1)]

    def peaks(self) -> list[int]:
        return [int(each) for each in self.ledger.lrange(f"{self.ns}:peaks", 0, -1)]

    def waiting(self, key: str) -> list[str]:
        states = {state.key: state for state in self.store.key_states()}
        return [w.thread_id for w in states[key].waiting] if key in states else []

    def send(self, thread_id: str, key: str, **input: Any) -> None:
        self.agent.apply_async((thread_id,), input, concurrency_key=key)

    def go(self) -> None:
        self.ledger.set(f"{self.ns}:go", 1)


@pytest.fixture(params=["redis", "sqlite"])
def setup(
    redis_broker: str,
    result_backend: str,
    redis_server: RedisServer,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[Setup]:
    store = redis_server.url if request.param == "redis" else f"sqlite:///{tmp_path / 'keys.db'}"
    made = Setup(redis_broker, redis_server, store, result_backend)
    yield made
    made.store.close()
    made.app._agentq_runtime.store.close()
    made.app.close()


@pytest.fixture
def worker(setup: Setup, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(
        concurrency: int = 4, sweep_interval: float = 0.2, pool: str = "threads"
    ) -> WorkerProcess:
        process = WorkerProcess(
            setup.app,
            {**setup.env, "AGENTQ_TEST_SWEEP_INTERVAL": str(sweep_interval)},
            tmp_path,
            concurrency=concurrency,
            pool=pool,
            app_module="tests.support.keyed_app",
        )
        started.append(process)
        return process.start()

    yield start
    for process in started:
        process.stop()


def test_a_cap_of_two_holds_across_two_workers_with_six_threads(setup: Setup, worker: Any) -> None:
    # No sweep runs during the test: each waiter starts because a thread left its slot.
    worker(sweep_interval=SLOW_SWEEP)
    worker(sweep_interval=SLOW_SWEEP)
    ids = [f"capped-{i}" for i in range(6)]
    for thread_id in ids:
        setup.send(thread_id, "tenant:42", work=0.3)
    for thread_id in ids:
        assert setup.agent.wait(thread_id, timeout=60) == thread_id
    assert sorted(setup.started()) == ids  # each ran once, from its first step
    assert max(setup.peaks()) == 2  # 8 pool slots, yet never more than 2 at once


def _park(setup: Setup, thread_id: str, key: str, position: int) -> None:
    setup.send(thread_id, key, block=True)
    wait_until(
        lambda: setup.waiting(key)[position - 1 : position] == [thread_id],
        timeout=30,
        what=f"{thread_id} parked at position {position}",
    )


def test_waiting_threads_start_in_arrival_order(setup: Setup, worker: Any) -> None:
    worker(sweep_interval=SLOW_SWEEP)  # woken by the slots freed, not by a sweep
    setup.send("holder", "tenant:solo", block=True)
    wait_until(lambda: setup.started() == ["holder"], timeout=30, what="the holder running")
    waiters = [f"waiter-{i}" for i in range(4)]
    for position, thread_id in enumerate(waiters, start=1):
        _park(setup, thread_id, "tenant:solo", position)
    meta = setup.store.meta("waiter-0")
    assert meta is not None and meta.status == Status.QUEUED
    assert setup.store.schedules(["waiter-0"])[0].due_at is None  # nothing polls it
    setup.go()
    for thread_id in ["holder", *waiters]:
        setup.agent.wait(thread_id, timeout=60)
    assert setup.started() == ["holder", *waiters]
    # Nobody holds or waits: the key is forgotten once the last thread left it, just
    # after the commit that ended it (which wait() returns on).
    wait_until(lambda: setup.store.key_states() == [], timeout=30, what="the key forgotten")


def test_a_killed_workers_slot_comes_back_within_its_lease_and_the_next_waiter_starts(
    setup: Setup, worker: Any
) -> None:
    doomed = worker(concurrency=1)
    setup.send("doomed", "tenant:solo", block=True)
    wait_until(lambda: setup.started() == ["doomed"], timeout=30, what="the slot held")
    worker()
    setup.send("next", "tenant:solo", work=0.0)
    wait_until(lambda: setup.waiting("tenant:solo") == ["next"], timeout=30, what="a waiter")
    doomed.kill()
    wait_until(
        lambda: "next" in setup.started(),
        timeout=LEASE_TTL + 5,
        what="the next waiter started on the reclaimed slot",
    )
    assert setup.agent.wait("next", timeout=30) == "next"
    setup.go()
    # The killed thread itself came back behind it and finished.
    assert setup.agent.wait("doomed", timeout=60) == "doomed"
    assert setup.started() == ["doomed", "next", "doomed"]


def test_cancelling_a_parked_thread_takes_it_out_of_the_queue(setup: Setup, worker: Any) -> None:
    worker()
    setup.send("holder", "tenant:solo", block=True)
    wait_until(lambda: setup.started() == ["holder"], timeout=30, what="the holder running")
    _park(setup, "dropped", "tenant:solo", 1)
    _park(setup, "kept", "tenant:solo", 2)
    assert setup.agent.cancel("dropped") == Status.CANCELLED
    assert setup.waiting("tenant:solo") == ["kept"]
    setup.go()
    assert setup.agent.wait("kept", timeout=60) == "kept"
    assert setup.started() == ["holder", "kept"]
    assert setup.agent.thread("dropped").status == Status.CANCELLED


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("nobody:1", "no limit is declared for 'nobody:1'"),
        ("calls-only", "caps no threads"),
        ("tenant:{tenant_id}", "must be 1-200 letters"),
    ],
)
def test_a_concurrency_key_nothing_caps_is_refused_when_sent(
    setup: Setup, key: str, words: str
) -> None:
    with pytest.raises(LimitError, match=words) as refused:
        setup.send("refused", key)
    assert "thread refused" in str(refused.value)
    assert setup.store.meta("refused") is None  # nothing stored, nothing sent


@pytest.mark.parametrize("threads", [0, -2, 1.5])
def test_a_thread_cap_below_one_is_refused_when_declared(threads: Any) -> None:
    with pytest.raises(LimitError, match="threads must be a whole number of at least 1"):
        agentq.limit("tenant:{tenant_id}", threads=threads)


def test_a_thread_whose_key_lost_its_declaration_since_it_was_sent_runs_uncapped(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    meta, _ = setup.store.open_thread(
        "orphan", task=setup.agent.name, options={"headers": {KEY_HEADER: "dropped:1"}}
    )
    assert setup.agent._seat_of(meta) is None
    assert "no limit is declared for 'dropped:1'" in caplog.text
    meta, _ = setup.store.open_thread(
        "kept", task=setup.agent.name, options={"headers": {KEY_HEADER: "tenant:9"}}
    )
    seat = setup.agent._seat_of(meta)
    assert (seat.key, seat.cap) == ("tenant:9", 2)


def test_a_crashed_thread_that_finds_its_key_full_is_counted_as_crashed_before_it_parks(
    setup: Setup, worker: Any
) -> None:
    worker()
    setup.send("holder", "tenant:solo", block=True)
    wait_until(lambda: setup.started() == ["holder"], timeout=30, what="the holder running")
    # A worker died driving it: running, under a lease nobody renews.
    setup.store.open_thread(
        "crashed", task=setup.agent.name, options={"headers": {KEY_HEADER: "tenant:solo"}}
    )
    setup.store.acquire("crashed", "dead-worker", 0.5)
    wait_until(
        lambda: setup.waiting("tenant:solo") == ["crashed"],
        timeout=30,
        what="the crashed thread sent again by the sweep and parked",
    )
    assert setup.agent.thread("crashed").crashes == 1
    setup.go()
    assert setup.agent.wait("crashed", timeout=60) == "crashed"


def test_a_woken_thread_cancelled_before_its_first_step_starts_the_next_waiter(
    setup: Setup, worker: Any
) -> None:
    store, key = setup.store, "tenant:solo"
    for thread_id in ("holder", "cancelled", "next"):
        store.open_thread(thread_id, task=setup.agent.name, options={"headers": {KEY_HEADER: key}})
    holder = store.acquire("holder", "elsewhere", 60)
    assert store.enter_key("holder", "elsewhere", holder, key, 1) == 0
    for position, thread_id in enumerate(("cancelled", "next"), start=1):
        token = store.acquire(thread_id, "elsewhere", 60)
        assert store.enter_key(thread_id, "elsewhere", token, key, 1) == position
    assert store.leave_key("holder", holder, key, start_grace=60) == ["cancelled"]
    # Woken, taken by a driver, cancelled before its first step, the driver then gone.
    token = store.acquire("cancelled", "elsewhere", 60)
    assert store.request_cancel("cancelled") == Status.RUNNING
    store.release("cancelled", "elsewhere", token)
    worker(sweep_interval=SLOW_SWEEP)  # the slot it was woken to must start the next
    setup.agent.enqueue("cancelled")
    assert setup.agent.wait("next", timeout=60) == "next"
    assert setup.agent.thread("cancelled").status == Status.CANCELLED
    assert setup.started() == ["next"]


def test_cancelling_a_woken_thread_that_has_not_started_starts_the_next_waiter(
    setup: Setup, worker: Any
) -> None:
    store, key = setup.store, "tenant:solo"
    for thread_id in ("holder", "woken", "next"):
        store.open_thread(thread_id, task=setup.agent.name, options={"headers": {KEY_HEADER: key}})
    holder = store.acquire("holder", "elsewhere", 60)
    assert store.enter_key("holder", "elsewhere", holder, key, 1) == 0
    for position, thread_id in enumerate(("woken", "next"), start=1):
        token = store.acquire(thread_id, "elsewhere", 60)
        assert store.enter_key(thread_id, "elsewhere", token, key, 1) == position
    # Woken with a slot reserved, its message not delivered yet.
    assert store.leave_key("holder", holder, key, start_grace=60) == ["woken"]
    worker(sweep_interval=SLOW_SWEEP)
    assert setup.agent.cancel("woken") == Status.CANCELLED
    assert setup.agent.wait("next", timeout=60) == "next"
    assert setup.started() == ["next"]


def test_a_parked_thread_whose_first_task_is_revoked_is_cancelled_when_woken(
    setup: Setup, worker: Any
) -> None:
    """Its first task ended ``WAITING_FOR_KEY``, which is not ready: ``revoke()`` looks
    like it stops the thread, which has run no step. Woken, the thread comes under a new
    task id no revoked set holds; it is cancelled all the same, its first task
    ``REVOKED``, and the slot goes to the next waiter. The pool is prefork, whose
    children, forked before the revoke, never see it: the worker's main process does."""
    key = "tenant:solo"
    started = worker(concurrency=2, sweep_interval=SLOW_SWEEP, pool="prefork")
    setup.send("holder", key, block=True)
    wait_until(lambda: setup.started() == ["holder"], timeout=30, what="the holder running")
    first = setup.agent.apply_async(("revoked",), {"work": 0.0}, concurrency_key=key)
    wait_until(lambda: first.state == WAITING_FOR_KEY, timeout=30, what="WAITING_FOR_KEY")
    _park(setup, "next", key, 2)
    first.revoke()

    def revoked_on_the_worker() -> bool:
        inspect = setup.app.control.inspect(destination=[started.name], timeout=1)
        return first.id in (inspect.revoked() or {}).get(started.name, [])

    wait_until(revoked_on_the_worker, timeout=30, what="the revoke received")
    setup.go()
    assert setup.agent.wait("next", timeout=60) == "next"
    assert setup.agent.thread("revoked").status == Status.CANCELLED
    assert setup.started() == ["holder", "next"]
    assert first.state == "REVOKED"
