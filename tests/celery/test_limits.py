"""Fleet-wide limits with real worker processes: the budget holds across processes, a
killed worker's concurrency slot comes back while a live one's long call keeps it, a 429
pauses the key for every worker, a call settles its real token usage once, and progress
events say what each step waited for."""

from __future__ import annotations

import contextlib
import itertools
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from agentq import Status
from agentq.errors import ThreadStopped
from agentq.store.contract.limits import Take
from agentq.store.redis import RedisStore
from tests.support.limits_app import LIMITS, make_limits_app
from tests.support.redis_server import RedisServer, wait_until
from tests.support.workers import WorkerProcess

LEASE_TTL = 2.0
LIMITS_BY_NAME = {each.name: each for each in LIMITS}


class Setup:
    def __init__(self, broker: str, server: RedisServer) -> None:
        self.prefix = f"lim{uuid.uuid4().hex[:8]}:"
        self.ns = self.prefix.rstrip(":")
        self.env = {
            "AGENTQ_TEST_BROKER": broker,
            "AGENTQ_TEST_STORE": server.url,
            "AGENTQ_TEST_PREFIX": self.prefix,
            "AGENTQ_TEST_QUEUE": f"agentq-limits-{self.prefix}",
            "AGENTQ_TEST_LEASE_TTL": str(LEASE_TTL),
        }
        self.app: Celery = make_limits_app(
            broker=broker,
            store=server.url,
            prefix=self.prefix,
            queue=self.env["AGENTQ_TEST_QUEUE"],
            lease_ttl=LEASE_TTL,
        )
        self.agent: Any = self.app.tasks["tests.limited_agent"]
        self.ledger = redis.Redis.from_url(server.url)
        self.store = RedisStore.from_url(server.url, prefix=self.prefix)

    def call_times(self) -> list[float]:
        return sorted(float(t) for t in self.ledger.lrange(f"{self.ns}:calls", 0, -1))

    def take_now(self, key: str) -> float:
        """The wait a take of ``key`` by another holder meets now (0: it got it, and gave
        it straight back)."""
        holder = f"probe-{uuid.uuid4().hex}"
        waited = self.store.take_limits([Take(key, LIMITS_BY_NAME[key], 0)], holder, 60).wait
        self.store.release_limits([key], holder)
        return waited


@pytest.fixture
def setup(redis_broker: str, redis_server: RedisServer) -> Iterator[Setup]:
    made = Setup(redis_broker, redis_server)
    yield made
    made.store.close()
    made.app._agentq_runtime.store.close()
    made.app.close()


@pytest.fixture
def worker(setup: Setup, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(concurrency: int = 2, queue: str | None = None) -> WorkerProcess:
        env = setup.env if queue is None else {**setup.env, "AGENTQ_TEST_QUEUE": queue}
        process = WorkerProcess(
            setup.app,
            env,
            tmp_path,
            concurrency=concurrency,
            pool="threads",
            app_module="tests.support.limits_app",
        )
        started.append(process)
        return process.start()

    yield start
    for process in started:
        process.stop()


def test_the_budget_holds_across_two_worker_processes(setup: Setup, worker: Any) -> None:
    worker()
    worker()
    ids = [f"fleet-{i}" for i in range(4)]
    for thread_id in ids:
        setup.agent.delay(thread_id, calls=6, limit="api")
    for thread_id in ids:
        assert len(setup.agent.wait(thread_id, timeout=60)) == 6
    times = setup.call_times()
    assert len(times) == 24
    # 600/min is 10 a second, 2 at once: no second of the fleet's holds more than 2 + 10
    # (one more for a call logged a moment after its take).
    for start in times:
        in_window = sum(1 for t in times if start <= t < start + 1.0)
        assert in_window <= 13, (start, in_window, times)


def test_a_wait_longer_than_limit_wait_ends_the_step_as_retrying(setup: Setup, worker: Any) -> None:
    worker(concurrency=1)
    setup.agent.delay("patient", calls=3, limit="slow")
    wait_until(
        lambda: (
            (meta := setup.store.meta("patient")) is not None and meta.status == Status.RETRYING
        ),
        timeout=30,
        what="the thread retrying on its limit",
    )
    assert len(setup.agent.wait("patient", timeout=60)) == 3
    times = setup.call_times()
    assert len(times) == 3
    # 60/min, one at once: a second between calls, on the store's clock.
    assert all(later - earlier >= 0.95 for earlier, later in itertools.pairwise(times))
    assert setup.store.meta("patient").attempts == 0  # waiting is not failing


def test_a_killed_workers_concurrency_slot_comes_back_within_the_lease_ttl(
    setup: Setup, worker: Any
) -> None:
    holder = worker(concurrency=1)
    setup.agent.delay("holds", calls=1, limit="one-at-a-time", block=True)
    wait_until(
        lambda: setup.ledger.llen(f"{setup.ns}:holding"),
        timeout=30,
        what="the call holding the slot",
    )
    assert setup.take_now("one-at-a-time") > 0  # held: nobody else gets it
    holder.kill()
    wait_until(
        lambda: setup.take_now("one-at-a-time") == 0,
        timeout=LEASE_TTL + 5,
        what="the slot reclaimed",
    )


def test_a_429_pauses_the_key_for_every_worker(setup: Setup, worker: Any) -> None:
    worker()
    elsewhere = f"{setup.env['AGENTQ_TEST_QUEUE']}-elsewhere"
    worker(queue=elsewhere)  # another process, which only the store tells of the 429
    setup.agent.delay("refused", calls=1, limit="provider", refuse=6)
    wait_until(
        lambda: setup.ledger.get(f"{setup.ns}:refused"),
        timeout=30,
        what="the provider's refusal",
    )
    wait_until(
        lambda: setup.take_now("provider") > 3,
        timeout=10,
        what="the key paused for another holder",
    )
    setup.agent.apply_async(("other",), {"calls": 1, "limit": "provider"}, queue=elsewhere)
    wait_until(
        lambda: (meta := setup.store.meta("other")) is not None and meta.status == Status.RETRYING,
        timeout=30,
        what="another thread waiting out the pause",
    )
    assert setup.call_times() == []  # nobody called through the pause
    assert setup.agent.wait("other", timeout=60) and setup.agent.wait("refused", timeout=60)
    assert len(setup.call_times()) == 2


def test_a_call_settles_its_real_usage_once_and_a_replay_settles_nothing(
    setup: Setup, worker: Any
) -> None:
    worker()
    # Each takes 5 of 60 tokens a minute and used 35: 30 more are charged, once.
    setup.agent.delay("charged", calls=1, limit="tokens", cost=5, used=35, fail_once=True)
    assert len(setup.agent.wait("charged", timeout=60)) == 1
    # The node ran twice, the tool once: the second run replayed the call.
    assert setup.ledger.get(f"{setup.ns}:failed:charged") == b"2"
    assert len(setup.call_times()) == 1
    left = setup.store.limit_states()["tokens"].tokens_left(LIMITS_BY_NAME["tokens"])
    # 25 left, plus one a second since; charged twice it would be 0 plus that.
    assert left is not None and 24 < left < 60
    # One that took 50 and used 1 gives 49 back: 50 are free again at once.
    setup.agent.delay("refunded", calls=1, limit="tokens", cost=50, used=1)
    assert len(setup.agent.wait("refunded", timeout=60)) == 1
    later = setup.store.limit_states()["tokens"].tokens_left(LIMITS_BY_NAME["tokens"])
    assert later is not None and later > 24


def test_a_call_longer_than_the_slot_ttl_keeps_its_slot_while_its_worker_lives(
    setup: Setup, worker: Any
) -> None:
    worker(concurrency=1)
    setup.agent.delay("long", calls=1, limit="one-at-a-time", block=True)
    wait_until(
        lambda: setup.ledger.llen(f"{setup.ns}:holding"),
        timeout=30,
        what="the call holding the slot",
    )
    holders = setup.store.keys.limit_holders("one-at-a-time")
    ((_, first_expiry),) = setup.ledger.zrange(holders, 0, -1, withscores=True)

    def server_time() -> float:
        seconds, micros = setup.ledger.time()
        return seconds + micros / 1e6

    wait_until(
        lambda: server_time() > first_expiry + LEASE_TTL / 2,
        timeout=LEASE_TTL + 10,
        what="the slot's first expiry passing",
    )
    assert setup.take_now("one-at-a-time") > 0  # renewed with the lease: still held
    setup.ledger.set(f"{setup.ns}:go", 1)
    assert len(setup.agent.wait("long", timeout=30)) == 1
    assert setup.take_now("one-at-a-time") == 0  # given back when the call returned


def test_progress_events_carry_the_steps_limit_waits(setup: Setup, worker: Any) -> None:
    events: list[dict[str, Any]] = []
    listening = threading.Event()
    done = threading.Event()

    def listen() -> None:
        with setup.app.connection_for_read() as connection:
            receiver = setup.app.events.Receiver(
                connection, handlers={"task-progress": events.append}
            )
            # Events sent before the receiver's queue exists are lost: start after it does.
            receiver.on_consume_ready = lambda *args, **kwargs: listening.set()
            with contextlib.suppress(TimeoutError, OSError):
                for _ in receiver.itercapture(limit=None, timeout=20, wakeup=False):
                    if done.is_set():
                        break

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert listening.wait(10)
    worker()
    # 600/min with a burst of 2: the third call waits a tenth of a second in place.
    setup.agent.delay("in-place", calls=3, limit="api")
    # 60/min with a burst of 1: the second call's wait is longer than limit_wait.
    setup.agent.delay("retried", calls=2, limit="slow")
    assert setup.agent.wait("in-place", timeout=60) and setup.agent.wait("retried", timeout=60)
    wait_until(lambda: len(events) >= 3, timeout=20, what="the progress events")
    done.set()
    listener.join(20)
    waits = {
        e["thread_id"]: e["limit_waits"] for e in events if e.get("limit_waits") and e["step"] == 0
    }
    [in_place] = waits["in-place"]
    assert in_place["keys"] == ["api"] and in_place["waited"] > 0
    retried = [w for e in events if e["thread_id"] == "retried" for w in e["limit_waits"]]
    assert any(w["keys"] == ["slow"] and w["due_at"] > 0 for w in retried if "due_at" in w)


def test_an_actual_cost_that_is_not_a_token_count_fails_the_thread_saying_so(
    setup: Setup, worker: Any
) -> None:
    worker()
    setup.agent.delay("miscounted", calls=1, limit="tokens", cost=5, used="many")
    with pytest.raises(ThreadStopped) as stopped:
        setup.agent.wait("miscounted", timeout=60)
    error = stopped.value.error or ""
    assert "LimitError" in error and "actual_cost returned 'many'" in error
    assert "thread miscounted step 0" in error


def test_a_cost_no_budget_could_take_fails_the_thread_and_leaves_no_claim(
    setup: Setup, worker: Any
) -> None:
    worker()
    setup.agent.delay("too-big", calls=1, limit="tokens", cost=100)
    with pytest.raises(ThreadStopped) as stopped:
        setup.agent.wait("too-big", timeout=60)
    assert "could never run" in (stopped.value.error or "")
    # The call never ran: retrying the thread claims it afresh, not as an unknown outcome.
    assert setup.store.effects("too-big") == []
