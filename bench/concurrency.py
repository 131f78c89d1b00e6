"""Many agent threads waiting at once on one worker: the wall time of N threads of 5 steps,
each step's node waiting 0.5 s as a model call does, against plain Celery tasks doing the
same waits on the same pool and concurrency.

Run from the repository root::

    python -m bench.concurrency [--quick]

Per configuration one ``celery worker`` subprocess, one private redis-server with AOF
always as the broker (and the ledger where the plain tasks count themselves), and another
as the agentq store, so that its connections are the store's alone and its fsyncs do not
hold up the broker's. The Celery configuration, the same for the plain tasks and the
agents, is what a user running 1000 tasks at once in one process sets:

- ``worker_prefetch_multiplier=1`` and ``acks_late`` (an ``AgentTask`` is acked late):
  a worker holds only the messages its slots run, each until it is done;
- ``broker_transport_options={"max_connections": concurrency + 10}``: every slot acks
  its own message when its task returns, through the consumer channel's connection pool,
  which does not wait for a free connection but fails (kombu's default of 10 fails
  ``Couldn't ack ... MaxConnectionsError`` under ``-P gevent -c 1000``, and each
  failed ack keeps its prefetch slot taken until the worker restarts and the message is
  delivered again); the 10 are the consumer's own.

The configurations:

- ``-P threads -c 500``, 1000 threads: sync nodes (``time.sleep``), then ``async def``
  nodes (``await asyncio.sleep``);
- ``-P gevent -c 1000``, 1000 threads: the same two (the worker is monkey-patched, so
  ``time.sleep`` cooperates);
- ``-P threads -c 100``, 100 threads, sync nodes, on a SQLite store (no store
  redis-server).

Each configuration first runs the baseline: N plain tasks, each five ``time.sleep(0.5)``.
Then each row sends its N threads with ``agent.delay(thread_id)`` and polls the store
until none is live, or until its deadline (5x the baseline + 60 s) passes. Wall time is
from the first send to the last thread settled, sending included (shown apart: each
``delay`` also opens the thread in the store, one fsync'd write); target: ÷ the baseline
≤ 1.15, reported only when every thread is ``done``. Before each timed run one no-op task
goes through the worker. Beside the ratio, per row:

- failed threads: ``failed``, ``cancelled`` or ``needs_attention`` in the store, and how
  many were still unfinished at the deadline;
- lease takeovers: fencing tokens handed out beyond each thread's first (``meta.fence``);
- pool errors: worker log records matching :data:`POOL_ERRORS`;
- peak store connections, sampled every 100 ms: the store redis-server's clients but
  the benchmark's own (named ``agentq-bench``), or for SQLite the worker's open
  descriptors of the database file; target: at most the bound the worker's store pool
  is configured with (``connections_for(concurrency)``; 1 for SQLite), printed beside;
- worker RSS per in-flight thread: the peak RSS of the worker's process tree ÷ the peak
  number of threads ``running`` at once, beside the plain tasks' (peak RSS ÷ peak started
  and not finished).

``--quick``: 20 threads of 2 steps of 0.05 s at ``-c 10`` (gevent: ``-c 20``, one wave as
at full size: under gevent Celery fetches the next message up to 2 s after an ack), to
prove it runs.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis
from celery import Celery

from agentq import Status, ThreadMeta
from agentq.settings import connections_for
from agentq.store.contract import Store
from agentq.store.redis.store import RedisStore
from bench._agents import make_app
from bench._cluster import Worker, wait_for
from bench._redis import PrivateRedis
from bench._report import Result, Target, exit_with, standalone
from bench._report import size as byte_size
from bench._sampling import Peaks, Sampler, open_files, process_tree

TARGET = Target(1.15)
NONE_ALLOWED = Target(0)
POOL_ERRORS = re.compile(
    r"MaxConnectionsError|Too many connections|ConnectionError|database is locked"
)
LOG_RECORD = re.compile(r"^(?=\[\d{4}-\d\d-\d\d )", re.MULTILINE)
"""Where a record of the worker's log starts: its timestamp, the lines after it until the
next one (a traceback) are part of it."""
POLL_EVERY = 0.05
SETTLED = (Status.DONE, Status.FAILED, Status.CANCELLED, Status.NEEDS_ATTENTION, Status.WAITING)
BROKEN = frozenset({Status.FAILED, Status.CANCELLED, Status.NEEDS_ATTENTION})
AGENTS = {"sync": "bench.sleep_agent", "async": "bench.async_sleep_agent"}
BENCH_CLIENT = "agentq-bench"
"""The client name of the benchmark's own store connections."""
BROKER_MARGIN = 10
"""Broker connections beyond one per pool slot: kombu's default, for the consumer itself."""


@dataclass(frozen=True)
class Config:
    """One worker and the rows it runs after its baseline."""

    pool: str
    concurrency: int
    threads: int
    store: str
    nodes: tuple[str, ...]

    def row_name(self, node: str) -> str:
        where = "sqlite_" if self.store == "sqlite" else ""
        return f"concurrency_{where}{self.pool}{self.concurrency}_{node}"

    def label(self, node: str) -> str:
        where = ", SQLite" if self.store == "sqlite" else ""
        return f"{self.threads} {node} threads, -P {self.pool} -c {self.concurrency}{where}"


@dataclass(frozen=True)
class Size:
    steps: int
    wait: float
    grace: float
    """Seconds a row may take beyond 5x its baseline before it counts as timed out."""
    configs: tuple[Config, ...]


BOTH = ("sync", "async")
SIZES = {
    False: Size(
        5,
        0.5,
        60.0,
        (
            Config("threads", 500, 1000, "redis", BOTH),
            Config("gevent", 1000, 1000, "redis", BOTH),
            Config("threads", 100, 100, "sqlite", ("sync",)),
        ),
    ),
    True: Size(
        2,
        0.05,
        10.0,
        (
            Config("threads", 10, 20, "redis", BOTH),
            Config("gevent", 20, 20, "redis", BOTH),
            Config("threads", 10, 20, "sqlite", ("sync",)),
        ),
    ),
}


# -- one configuration's worker ---------------------------------------------------------------


@dataclass
class Env:
    config: Config
    app: Celery
    store: Store
    broker: redis.Redis
    """The broker's redis-server, where the plain tasks count themselves too."""
    store_server: redis.Redis | None
    """The Redis store's own redis-server (``None`` on SQLite)."""
    worker: Worker
    database: Path | None

    def connections(self) -> int:
        """The worker's store connections: the store server's clients but the benchmark's."""
        if self.database is not None:
            return open_files(self.pids(), self.database)
        assert self.store_server is not None
        clients = self.store_server.client_list()
        return sum(client.get("name") != BENCH_CLIENT for client in clients)

    def pids(self) -> list[int]:
        assert self.worker.process is not None
        return process_tree(self.worker.process.pid)

    def count(self, status: Status) -> int:
        store = self.store
        if isinstance(store, RedisStore):
            return int(store.client.zcard(store.keys.status_index(status)))
        return len(store.threads(status, limit=self.config.threads * 10))

    def settled(self) -> int:
        return sum(self.count(status) for status in SETTLED)

    def log_size(self) -> int:
        return self.worker.log.stat().st_size

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.worker.log.read_text(errors="replace").splitlines()[-lines:])

    def pool_errors(self, since: int) -> list[str]:
        """The first lines of the worker log's records written after ``since`` that match
        :data:`POOL_ERRORS`: one per error, though its traceback names it again."""
        with open(self.worker.log, "rb") as log:
            log.seek(since)
            text = log.read().decode(errors="replace")
        records = LOG_RECORD.split(text)
        return [record.strip().splitlines()[0] for record in records if POOL_ERRORS.search(record)]


def connection_bound(config: Config) -> int:
    """How many store connections the worker may hold: its one process runs every task
    (threads and gevent pools); a SQLite store shares one connection among them."""
    return 1 if config.store == "sqlite" else connections_for(config.concurrency)


@contextlib.contextmanager
def environment(config: Config) -> Iterator[Env]:
    """A private redis-server as broker, another as the store unless SQLite, and one
    worker on them."""
    run_id = uuid.uuid4().hex[:8]
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(PrivateRedis())
        url = f"redis://127.0.0.1:{server.port}/0"
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agentq-bench-")))
        database = scratch / "agentq.db" if config.store == "sqlite" else None
        store_server = None if database else stack.enter_context(PrivateRedis())
        store_url = (
            f"sqlite:///{database}"
            if store_server is None
            else f"redis://127.0.0.1:{store_server.port}/0"
        )
        env = {
            "BENCH_BROKER": url,
            "BENCH_STORE": store_url,
            "BENCH_LEDGER": url,
            "BENCH_PREFIX": f"b{run_id}:",
            "BENCH_QUEUE": f"agentq-bench-{run_id}",
            "BENCH_BROKER_CONNECTIONS": str(config.concurrency + BROKER_MARGIN),
        }
        app = make_app(
            broker=url,
            # The benchmark's own connections are named, so the peak can leave them out.
            store=store_url if database else f"{store_url}?client_name={BENCH_CLIENT}",
            ledger=url,
            prefix=env["BENCH_PREFIX"],
            queue=env["BENCH_QUEUE"],
            broker_connections=config.concurrency + BROKER_MARGIN,
        )
        stack.callback(app.close)
        worker = Worker(app, env, scratch / "worker.log", config.concurrency, config.pool)
        stack.callback(worker.stop)
        worker.start()
        store = app._agentq_runtime.store
        stack.callback(store.close)
        broker = stack.enter_context(contextlib.closing(server.client()))
        probe = (
            None
            if store_server is None
            else stack.enter_context(
                contextlib.closing(store_server.client(client_name=BENCH_CLIENT))
            )
        )
        try:
            yield Env(config, app, store, broker, probe, worker, database)
        except BaseException:
            worker.kill()  # interrupted or failed: nothing in flight is worth waiting for
            raise


# -- the rows ---------------------------------------------------------------------------------


def settle(env: Env, label: str) -> None:
    """One no-op task through the worker before a timed row: under gevent Celery's consumer
    loop can sit up to 2 s after the previous row's acks before it fetches again, which
    would be charged to the next row."""
    counter = f"settle:{label}"
    env.app.tasks["bench.noop"].delay(counter)
    wait_for(lambda: env.broker.get(counter) is not None, 60, "the worker fetching again", 0.02)


@dataclass(frozen=True)
class Baseline:
    wall: float
    sending: float
    peaks: Peaks


def baseline(env: Env, size: Size) -> Baseline:
    """N plain tasks, each ``steps`` sleeps of ``wait`` s; the wall time from first send to
    last completion."""
    task, counter, total = env.app.tasks["bench.sleep_loop"], "plain", env.config.threads
    ledger = env.broker

    def finished() -> int:
        return int(ledger.get(counter) or 0)

    def in_flight() -> int:
        return int(ledger.get(f"{counter}:started") or 0) - finished()

    waves = -(-total // env.config.concurrency)
    with Sampler(env.pids(), env.connections, in_flight) as sampler:
        started = time.perf_counter()
        for _ in range(total):
            task.delay(size.steps, size.wait, counter)
        sending = time.perf_counter() - started
        try:
            wait_for(
                lambda: finished() >= total,
                5 * waves * size.steps * size.wait + size.grace,
                "plain tasks done",
                POLL_EVERY,
            )
        except TimeoutError as exc:
            print(f"plain tasks not done; the worker log ends:\n{env.log_tail()}")  # progress
            stuck = f"{finished()} of {total} finished, {in_flight()} in flight"
            raise TimeoutError(f"{exc} ({stuck})") from None
        wall = time.perf_counter() - started
    return Baseline(wall, sending, sampler.peaks)


@dataclass(frozen=True)
class Row:
    wall: float
    sending: float
    """Seconds the ``delay`` calls took, part of ``wall``."""
    deadline: float
    done: int
    failed: int
    unfinished: int
    takeovers: int
    pool_errors: list[str]
    peaks: Peaks
    first_failure: str
    """The first line of the error the first failed thread stored."""


def _first_failure(metas: list[ThreadMeta | None]) -> str:
    for meta in metas:
        if meta is not None and meta.status in BROKEN:
            return (meta.error or meta.status.value).strip().splitlines()[0][:70]
    return ""


def agent_row(env: Env, size: Size, node: str, base: Baseline) -> Row:
    """Send N threads, poll the store until none is live or the deadline passes, then read
    every thread's meta."""
    agent, total = env.app.tasks[AGENTS[node]], env.config.threads
    thread_ids = [f"{node}-{k}" for k in range(total)]
    deadline = 5 * base.wall + size.grace
    target = env.settled() + total
    since = env.log_size()
    with Sampler(env.pids(), env.connections, lambda: env.count(Status.RUNNING)) as sampler:
        started = time.perf_counter()
        for thread_id in thread_ids:
            agent.delay(thread_id, steps=size.steps, wait=size.wait)
        sending = time.perf_counter() - started
        with contextlib.suppress(TimeoutError):  # the row reports what did not finish
            wait_for(
                lambda: env.settled() >= target,
                deadline - (time.perf_counter() - started),
                "threads settled",
                POLL_EVERY,
            )
        wall = time.perf_counter() - started
    metas = [env.store.meta(thread_id) for thread_id in thread_ids]
    statuses = [meta.status if meta else Status.QUEUED for meta in metas]
    errors = env.pool_errors(since)
    if errors:  # progress output (stderr): what the worker's pool ran into
        print(f"{env.config.label(node)}: {len(errors)} pool errors, the first: {errors[0]}")
    return Row(
        wall=wall,
        sending=sending,
        deadline=deadline,
        done=statuses.count(Status.DONE),
        failed=sum(status in BROKEN for status in statuses),
        unfinished=sum(status.is_live for status in statuses),
        takeovers=sum(max(0, meta.fence - 1) for meta in metas if meta),
        pool_errors=errors,
        first_failure=_first_failure(metas),
        peaks=sampler.peaks,
    )


def _first_error(lines: list[str]) -> str:
    """The exception named in the first matching record, for the table (from its first
    line, or the record's message when only its traceback names one)."""
    if not lines:
        return ""
    match = POOL_ERRORS.search(lines[0])
    start = match.start() if match else lines[0].find("] ") + 2
    return f"first: {lines[0][start:][:60]}"


def results(config: Config, node: str, base: Baseline, row: Row) -> list[Result]:
    name, total = config.row_name(node), config.threads
    if row.done == total:
        value: float | None = row.wall / base.wall
        note = f"sent in {row.sending:.1f} s"
        measured = f"{row.wall:.2f} s"
    else:
        value = None
        note = f"error: {total - row.done} of {total} not done"
        measured = f"{row.wall:.2f} s" + (" (timed out)" if row.unfinished else "")
    timeout = f"{row.unfinished} unfinished at the {row.deadline:.0f} s deadline"
    sqlite, bound = config.store == "sqlite", connection_bound(config)
    return [
        Result(
            "ratio",
            f"{name}_wall_over_celery",
            value,
            f"{config.label(node)}: wall ÷ plain Celery",
            measured,
            f"{base.wall:.2f} s (sent in {base.sending:.1f} s)",
            TARGET,
            note,
        ),
        Result(
            "figure",
            f"{name}_failed_threads",
            row.failed,
            "  failed threads (store status)",
            f"{row.failed} of {total}",
            target=NONE_ALLOWED,
            note="; ".join(
                part for part in (row.first_failure, timeout if row.unfinished else "") if part
            ),
        ),
        Result(
            "figure",
            f"{name}_lease_takeovers",
            row.takeovers,
            "  lease takeovers (fencing tokens beyond the first)",
            str(row.takeovers),
            target=NONE_ALLOWED,
        ),
        Result(
            "figure",
            f"{name}_pool_errors",
            len(row.pool_errors),
            "  pool errors in the worker log",
            str(len(row.pool_errors)),
            target=NONE_ALLOWED,
            note=_first_error(row.pool_errors),
        ),
        Result(
            "figure",
            f"{name}_peak_store_connections",
            row.peaks.connections,
            "  peak open SQLite files" if sqlite else "  peak worker store connections",
            str(row.peaks.connections),
            f"bound {bound}",
            Target(bound),
        ),
        Result(
            "figure",
            f"{name}_rss_kb_per_thread",
            row.peaks.rss_per_in_flight / 1024,
            "  worker RSS per in-flight thread, KB",
            f"{byte_size(row.peaks.rss)} / {row.peaks.in_flight}",
            f"plain {base.peaks.rss_per_in_flight / 1024:.0f} KB "
            f"({byte_size(base.peaks.rss)} / {base.peaks.in_flight})",
            note="" if row.done == total else "few in flight: threads failed",
        ),
    ]


def run(quick: bool) -> list[Result]:
    size = SIZES[quick]
    out: list[Result] = []
    for config in size.configs:
        with environment(config) as env:
            settle(env, "plain")
            base = baseline(env, size)
            # Sync first: a row that times out leaves its threads behind for the next one.
            for node in config.nodes:
                settle(env, node)
                out += results(config, node, base, agent_row(env, size, node, base))
    return out


def main(argv: list[str] | None = None) -> int:
    return standalone("python -m bench.concurrency", __doc__, run, argv)


if __name__ == "__main__":
    exit_with(main)
