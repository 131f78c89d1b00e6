"""Hundreds of threads in flight in one ``celery worker`` process while its store freezes
(SIGSTOP) for less and for longer than the lease, or is SIGKILLed and restarted on its AOF:
every thread ends done, each tool effect is applied once, no thread counts the outage as
a lost worker, and the worker logs no failed task and no traceback. Also through a
restart of the broker (a Redis server of the test's own). Then the worker's
threads, descriptors and store connections after many threads: bounded by its pool, not
by how many threads went through it.

CI size: 200 threads on ``-c 200``. The same scenarios were run by hand at 500 threads on
``-P threads -c 500`` and ``-P gevent -c 1000`` (see the README's "Many agents per worker").
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from agentq import Status
from agentq.settings import connections_for
from agentq.store.contract import Store
from agentq.store.redis.base import SOCKET_TIMEOUT
from tests.support.agents import AsyncChaosAgent, ChaosAgent, ChaosLedger, make_app
from tests.support.redis_server import RedisServer, wait_until
from tests.support.workers import WorkerProcess

# Beyond the suite's minute a test: a worker's start, 200 threads sent and a 14 s outage
# already take most of it on a loaded 2-core machine; the deadlines below bound each wait.
pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(420)]

WORKER_APP = "tests.chaos.worker_app"
LEASE_TTL = 12.0
START_GRACE = 12.0
ROUNDS = 2
"""Each thread: start, then per round a model step and a tools step (a refund and an
email), then a last model step."""


@dataclass
class Cell:
    """A store, a ledger (the outside world, on a server of its own so that freezing the
    store freezes agentq alone), a client app and one worker."""

    store_server: RedisServer
    broker_server: RedisServer
    app: Celery
    ledger: ChaosLedger
    worker: WorkerProcess
    replacements: list[WorkerProcess] = field(default_factory=list)

    def replace_a_dead_worker(self) -> None:
        """Start a worker like the first if the last one died: kombu's Redis transport
        sometimes fails to close its channel as the broker goes (``AttributeError:
        'NoneType' object has no attribute 'hostname'``), an "Unrecoverable error" that
        stops the worker, whose agents hand their threads over as at a shutdown."""
        last = (self.replacements or [self.worker])[-1]
        if not last.running:
            worker = WorkerProcess(
                self.app,
                last.env,
                last.log.parent,
                concurrency=last.concurrency,
                pool=last.pool,
                app_module=last.app_module,
            )
            self.replacements.append(worker)
            worker.start()

    def log(self) -> str:
        return "".join(w.log.read_text(errors="replace") for w in [self.worker, *self.replacements])

    @property
    def store(self) -> Store:
        store: Store = self.app._agentq_runtime.store
        return store


MakeCell = Callable[[str, int], Cell]
"""Starts a cell whose worker runs ``-P <pool> -c <concurrency>``."""


@pytest.fixture
def cell_factory(tmp_path: Path) -> Iterator[MakeCell]:
    started: list[Cell] = []
    servers: list[RedisServer] = []

    def make(pool: str, concurrency: int) -> Cell:
        store_server = RedisServer(tmp_path / "store").start()
        ledger_server = RedisServer(tmp_path / "ledger").start()
        # A broker of its own, to restart; on AOF, as a broker that keeps its messages.
        broker_server = RedisServer(tmp_path / "broker").start()
        servers.extend((store_server, ledger_server, broker_server))
        redis_broker = broker_server.url
        prefix = f"mf{uuid.uuid4().hex[:8]}:"
        env = {
            "AGENTQ_TEST_BROKER": redis_broker,
            "AGENTQ_TEST_STORE": store_server.url,
            "AGENTQ_TEST_PREFIX": prefix,
            "AGENTQ_TEST_QUEUE": f"agentq-test-{prefix}",
            "AGENTQ_TEST_LEDGER": ledger_server.url,
            "AGENTQ_TEST_LEASE_TTL": str(LEASE_TTL),
            # Longer than sending every thread takes, so that few queued threads are sent
            # twice, and short enough that one whose message the broker lost (popped as
            # it was killed) is sent again within the test.
            "AGENTQ_TEST_START_GRACE": str(START_GRACE),
            "AGENTQ_TEST_CONCURRENCY": str(concurrency),
        }
        app = make_app(
            broker=redis_broker,
            store=store_server.url,
            prefix=prefix,
            queue=env["AGENTQ_TEST_QUEUE"],
            ledger_url=ledger_server.url,
            lease_ttl=LEASE_TTL,
            start_grace=START_GRACE,
        )
        app.register_task(ChaosAgent())
        app.register_task(AsyncChaosAgent())
        ledger = ChaosLedger(ledger_server.url, prefix.rstrip(":"), app._agentq_runtime.store)
        (tmp_path / "logs").mkdir(exist_ok=True)
        worker = WorkerProcess(
            app, env, tmp_path / "logs", concurrency=concurrency, pool=pool, app_module=WORKER_APP
        )
        cell = Cell(store_server, broker_server, app, ledger, worker)
        started.append(cell)
        worker.start()
        return cell

    yield make
    for cell in started:
        for worker in [cell.worker, *cell.replacements]:
            worker.stop()
        cell.ledger.client.close()
        cell.store.close()
        cell.app.close()
    for server in servers:
        server.stop()


def send(agent: Any, thread_ids: list[str], **kwargs: Any) -> None:
    """Every thread, from a few senders at once (each ``delay`` is an fsync'd write)."""
    with ThreadPoolExecutor(8) as senders:
        list(senders.map(lambda t: agent.delay(t, **kwargs), thread_ids))


def running(store: Store) -> int:
    try:
        return store.status_counts()[Status.RUNNING]
    except Exception as exc:
        if store.is_transient(exc):
            return 0
        raise


def settled(store: Store, count: int) -> bool:
    try:
        counts = store.status_counts()
    except Exception as exc:
        if store.is_transient(exc):
            return False
        raise
    return sum(counts[s] for s in (Status.DONE, Status.FAILED, Status.NEEDS_ATTENTION)) == count


def freeze(server: RedisServer, seconds: float) -> None:
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP)
    try:
        time.sleep(seconds)  # the outage itself, not a wait for a condition
    finally:
        server.process.send_signal(signal.SIGCONT)


FAULTS: dict[str, Callable[[Cell], object]] = {
    # Longer than a reply is waited for: the calls in flight fail and are tried again.
    "frozen-within-the-lease": lambda cell: freeze(cell.store_server, SOCKET_TIMEOUT + 2),
    "frozen-past-the-lease": lambda cell: freeze(cell.store_server, LEASE_TTL + 2),
    "killed-and-restarted": lambda cell: cell.store_server.restart(down=1.5),
    # The worker's consumer reconnects; a message popped as the broker died is lost, and
    # its thread is sent again by the sweeper a start grace after it was queued.
    "broker-restarted": lambda cell: cell.broker_server.restart(down=1.5),
}


@pytest.mark.parametrize(
    ("pool", "async_nodes", "fault"),
    [
        ("threads", False, "frozen-within-the-lease"),
        ("gevent", True, "frozen-within-the-lease"),
        ("threads", True, "frozen-past-the-lease"),
        ("gevent", False, "frozen-past-the-lease"),
        ("threads", False, "killed-and-restarted"),
        ("gevent", True, "killed-and-restarted"),
        ("threads", False, "broker-restarted"),
    ],
)
def test_two_hundred_threads_outlive_a_store_fault_each_effect_once(
    cell_factory: MakeCell, pool: str, async_nodes: bool, fault: str
) -> None:
    threads = 200
    cell = cell_factory(pool, threads)
    agent = cell.app.tasks[(AsyncChaosAgent if async_nodes else ChaosAgent).name]
    ids = [f"t{n:03d}" for n in range(threads)]
    send(agent, ids, rounds=ROUNDS, latency=2.0)
    wait_until(
        lambda: running(cell.store) >= threads * 3 // 4,
        timeout=60,
        what="most threads in flight",
    )
    FAULTS[fault](cell)

    def finished() -> bool:
        if fault == "broker-restarted":
            cell.replace_a_dead_worker()
        return settled(cell.store, threads)

    wait_until(finished, timeout=120, interval=0.2, what="every thread")

    expected_amounts = {str(10 * n) for n in range(1, ROUNDS + 1)}
    expected_mails = {f'"c{n}@ex.com"' for n in range(1, ROUNDS + 1)}
    problems = []
    for thread_id in ids:
        meta = cell.store.meta(thread_id)
        assert meta is not None
        if (meta.status, meta.crashes) != (Status.DONE, 0):
            problems.append(f"{thread_id}: {meta.status.value}, crashes {meta.crashes}")
        invocations = cell.ledger.invocations(thread_id)
        mails = {k: n for k, n in invocations.items() if k.startswith("notify:")}
        if len(mails) != ROUNDS or set(mails.values()) != {1}:
            problems.append(f"{thread_id}: emails sent {mails}")
        effects = cell.ledger.effects(thread_id)
        applied = {v for k, v in effects.items() if k.startswith("refund:")}
        sent = {v for k, v in effects.items() if k.startswith("notify:")}
        if (applied, sent) != (expected_amounts, expected_mails):
            problems.append(f"{thread_id}: effects {effects}")
    assert problems == []
    log = cell.log()
    assert log.count("raised unexpected") == 0
    if fault != "broker-restarted":  # Celery and kombu log their reconnection with tracebacks
        assert log.count("Traceback") == 0
    if fault != "frozen-past-the-lease":
        # Each driver waited the outage out under its own lease: none gave its thread up.
        assert (log.count("lease lost"), log.count("stayed unreachable")) == (0, 0)


def handles(worker: WorkerProcess, store_port: int) -> dict[str, int]:
    """The worker's OS threads, open descriptors and connections to the store."""
    pid = worker.pid
    sockets = subprocess.run(
        ["ss", "-tnpH", "state", "established", f"dst 127.0.0.1:{store_port}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {
        "threads": len(os.listdir(f"/proc/{pid}/task")),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "store_connections": sum(f"pid={pid}," in line for line in sockets.splitlines()),
    }


def test_threads_through_a_worker_leave_no_thread_or_connection_behind(
    cell_factory: MakeCell,
) -> None:
    """Ten waves of threads through ``-P threads -c 50``: what the worker holds after them
    is what it held after the first, bounded by its pool, whatever went through it."""
    concurrency, waves = 50, 10
    cell = cell_factory("threads", concurrency)
    agent = cell.app.tasks["tests.waiting_agent"]
    after: list[dict[str, int]] = []
    for wave in range(waves):
        ids = [f"w{wave}-{n}" for n in range(concurrency)]
        send(agent, ids, steps=2, wait=0.2)
        wait_until(
            lambda done=concurrency * (wave + 1): settled(cell.store, done),
            timeout=60,
            interval=0.1,
            what=f"wave {wave} done",
        )
        after.append(handles(cell.worker, cell.store_server.port))
    first, last = after[0], after[-1]
    assert last["store_connections"] <= connections_for(concurrency)
    # A thread left per agent thread, or a connection, would add 450 after the first wave.
    assert last["threads"] <= concurrency + THREADS_BESIDE_THE_POOL
    # Beside the store's pool, which opens connections lazily up to its bound.
    assert (
        last["fds"] - last["store_connections"]
        <= first["fds"] - first["store_connections"] + FDS_SLACK
    ), after


THREADS_BESIDE_THE_POOL = 12
"""The worker's own OS threads beside its pool's (the main thread, Celery's timer and
heartbeat, agentq's lease keeper, sweeper and event loop, the metrics server)."""
FDS_SLACK = 10
"""Descriptors other than the store's the worker may open after its first wave (the
broker's pooled connections, opened lazily), far fewer than the threads that went
through it."""
