"""Chaos for agentq: many threads on real workers while workers and the store are killed.

Shared by ``tests/chaos/test_chaos.py`` (CI size) and ``python -m bench.chaos`` (full size).

A private ``redis-server`` (AOF, ``appendfsync always``) holds the ledger (the outside world
the agent's tools change) and the store, unless the store is a SQLite file of the run's own.
The broker is the caller's (the tests give a private one), on a queue of the run's own.
2-3 ``celery worker`` subprocesses (prefork or ``-P threads``) drive
:class:`~tests.support.agents.ChaosAgent` threads while a chaos loop, bounded in count and
time, does one of these at a time:

``kill``     SIGKILL a worker's whole process group (OOM kill), start a replacement;
``deploy``   start a replacement, SIGTERM the old worker's main process (warm shutdown),
             wait for it to leave;
``zombie``   SIGSTOP a worker's group for longer than the lease TTL, then SIGCONT it;
``store``    SIGKILL ``redis-server`` and restart it on its AOF; on SQLite, hold the
             database's write lock from another process (a backup, a migration) as long.

Recovery is the workers' own (leases, the sweeper); nothing is re-sent by hand. At the end
:func:`verify` checks every thread against an uninterrupted reference run of the same
agent, the ledger, and every stored checkpoint, and computes the figures.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import signal
import sqlite3
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import redis
from celery import Celery

from agentq import Status
from agentq.celery.runtime import runtime_of
from agentq.errors import AgentqError, StoreUnavailable
from agentq.records import FINISHED, ThreadMeta
from agentq.store.contract import Store
from agentq.store.redis.store import RedisStore
from tests.support.agents import Arrival, AsyncChaosAgent, ChaosAgent, ChaosLedger, make_app
from tests.support.redis_server import RedisServer, wait_until
from tests.support.workers import WorkerProcess

WORKER_APP = "tests.chaos.worker_app"
ACTIONS = ("kill", "deploy", "zombie", "store")
SETTLED = FINISHED | {Status.NEEDS_ATTENTION}
"""The statuses the run stops waiting for a thread at: no worker moves it on from them."""

Say = Callable[[str], None]


@dataclass(frozen=True)
class ChaosConfig:
    """The size of a run and the pace of the chaos. Every duration is in seconds."""

    threads: int = 30
    steps: int = 10
    """Steps per thread, at least 8; rounded up to the agent's ``2 * rounds + 2``."""
    workers: int = 3
    pool: str = "prefork"
    """The workers' ``-P``: under ``threads`` a SIGKILL takes down ``concurrency`` threads
    driven by one process at once."""
    concurrency: int = 4
    async_nodes: bool = False
    """Run :class:`~tests.support.agents.AsyncChaosAgent`, whose model and tools are
    ``async def``, rather than :class:`~tests.support.agents.ChaosAgent`."""
    latency: float = 1.0
    """A model step's duration; each of a tools step's two calls takes half of it."""
    arrival_seconds: float = 60.0
    """The threads arrive evenly over this time, as traffic does, so the chaos meets
    threads at every stage; size ``workers * concurrency`` above the threads running at
    once (``threads * steps * latency / arrival_seconds``), or a recovered thread's
    message waits for a free process and the resume times measure the backlog."""
    lease_ttl: float = 2.0
    start_grace: float = 3.0
    max_crashes: int = 10
    """Lost workers in a row at one step before a thread fails. The default (3) is meant
    for a step that kills its worker; here several unrelated kills can hit one step."""
    pace: tuple[float, float] = (1.0, 2.0)
    """Seconds between two chaos actions, drawn uniformly."""
    store_down: tuple[float, float] = (0.0, 1.5)
    """How long ``redis-server`` stays dead before its restart (on SQLite, the write lock
    is held), drawn uniformly: long enough that calls made meanwhile fail rather than
    being retried through it."""
    max_actions: int = 40
    chaos_seconds: float = 90.0
    """No action starts after this; the run then only waits for the threads."""
    finish_timeout: float = 120.0
    """How long the threads may take to finish after the last action."""
    seed: int | None = None
    store: str = "redis"
    """``redis``, or ``sqlite`` for a SQLite file shared by the workers."""
    broker: str = field(kw_only=True)
    """A Redis broker URL; the run purges its own queue from it at the end."""

    def __post_init__(self) -> None:
        if self.steps < 8:
            raise ValueError(f"steps must be at least 8, got {self.steps}")
        if self.threads < 1 or self.workers < 2 or self.concurrency < 1:
            raise ValueError("need at least 1 thread and 2 workers of concurrency >= 1")

    @property
    def rounds(self) -> int:
        return math.ceil((self.steps - 2) / 2)

    @property
    def steps_per_thread(self) -> int:
        return 2 * self.rounds + 2

    @property
    def zombie_pause(self) -> float:
        return self.lease_ttl + 1.5


class ChaosCluster:
    """The private store server, the workers, and a client app on the broker."""

    def __init__(self, config: ChaosConfig, workdir: Path) -> None:
        self.config = config
        self.workdir = workdir
        self.server = RedisServer(workdir / "store")
        self.database = workdir / "store.db"
        self.store_url = (
            f"sqlite:///{self.database}" if config.store == "sqlite" else self.server.url
        )
        run = uuid.uuid4().hex[:10]
        self.prefix = f"ch{run}:"
        self.queue = f"agentq-chaos-{run}"
        self.env = {
            "AGENTQ_TEST_BROKER": config.broker,
            "AGENTQ_TEST_STORE": self.store_url,
            "AGENTQ_TEST_PREFIX": self.prefix,
            "AGENTQ_TEST_QUEUE": self.queue,
            "AGENTQ_TEST_LEDGER": self.server.url,
            "AGENTQ_TEST_LEASE_TTL": str(config.lease_ttl),
            "AGENTQ_TEST_START_GRACE": str(config.start_grace),
            "AGENTQ_TEST_MAX_CRASHES": str(config.max_crashes),
            "AGENTQ_TEST_CONCURRENCY": str(config.concurrency),
            "AGENTQ_TEST_KEEP_LAST": str(max(1000, config.steps_per_thread + 10)),
        }
        self.app: Celery | None = None
        self.ledger: ChaosLedger | None = None
        self.workers: list[WorkerProcess] = []
        self.retired: list[WorkerProcess] = []
        self.log_dir = workdir / "logs"
        self.agent_type = AsyncChaosAgent if config.async_nodes else ChaosAgent

    def start(self) -> ChaosCluster:
        self.server.start()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        app = make_app(
            broker=self.config.broker,
            store=self.store_url,
            prefix=self.prefix,
            queue=self.queue,
            ledger_url=self.server.url,
            lease_ttl=self.config.lease_ttl,
            start_grace=self.config.start_grace,
        )
        app.register_task(self.agent_type())
        self.app = app
        self.ledger = ChaosLedger(self.server.url, self.prefix.rstrip(":"), self.store)
        return self

    @property
    def agent(self) -> Any:
        assert self.app is not None
        return self.app.tasks[self.agent_type.name]

    @property
    def store(self) -> Store:
        assert self.app is not None
        return runtime_of(self.app).store

    def store_outage(self, seconds: float) -> str:
        """Take the store away for about ``seconds``; say what was done."""
        if self.config.store == "sqlite":
            with contextlib.closing(sqlite3.connect(self.database, isolation_level=None)) as db:
                db.execute("BEGIN IMMEDIATE")
                time.sleep(seconds)  # the outage itself, not a wait for a condition
                db.execute("ROLLBACK")
            return f"another process held the database's write lock for {seconds:.2f} s"
        outage = self.server.restart(down=seconds)
        return f"SIGKILL redis-server, restarted on its AOF in {outage:.2f} s"

    def start_worker(self) -> WorkerProcess:
        assert self.app is not None
        worker = WorkerProcess(
            self.app,
            self.env,
            self.log_dir,
            concurrency=self.config.concurrency,
            pool=self.config.pool,
            app_module=WORKER_APP,
        )
        self.workers.append(worker)  # before start: a worker that fails to start is stopped
        return worker.start()

    def retire(self, worker: WorkerProcess) -> None:
        self.workers.remove(worker)
        self.retired.append(worker)

    def close(self) -> None:
        """Stop every process this cluster started and remove its keys from the broker."""
        errors: list[BaseException] = []
        for worker in self.workers + self.retired:
            try:
                worker.stop()
            except Exception as exc:  # keep stopping the others
                errors.append(exc)
        try:
            self.server.stop()
        finally:
            if self.ledger is not None:
                self.ledger.client.close()
            if self.app is not None:
                with contextlib.suppress(Exception):
                    runtime_of(self.app).store.close()
                with contextlib.suppress(Exception):
                    purge_broker(self.config.broker, self.queue)
                self.app.close()
        if errors:
            raise errors[0]


@contextlib.contextmanager
def chaos_cluster(config: ChaosConfig, workdir: Path) -> Iterator[ChaosCluster]:
    cluster = ChaosCluster(config, workdir)
    try:
        yield cluster.start()
    finally:
        cluster.close()


def purge_broker(url: str, queue: str) -> None:
    """Remove the run's queue, bindings and unacked messages (left by SIGKILLed workers)
    from the broker, so nothing restores them an hour later."""
    client = redis.Redis.from_url(url)
    try:
        for key in client.scan_iter(match=f"*{queue}*", count=1000):
            client.delete(key)
        for tag, raw in client.hscan_iter("unacked", count=1000):
            with contextlib.suppress(ValueError, IndexError, TypeError):
                if json.loads(raw)[2] == queue:
                    client.hdel("unacked", tag)
                    client.zrem("unacked_index", tag)
    finally:
        client.close()


# -- the run -----------------------------------------------------------------------------------


@dataclass
class KillEvent:
    at: float
    """Unix time of the SIGKILL."""
    tokens: dict[str, int]
    """The threads the killed worker held a lease on, with the lease's fencing token."""


@dataclass
class ChaosLog:
    kills: list[KillEvent] = field(default_factory=list)
    deploy_exits: list[float] = field(default_factory=list)
    """Seconds from SIGTERM to the worker's exit, per deploy."""
    zombies: int = 0
    frozen: dict[str, set[Arrival]] = field(default_factory=dict)
    """Per thread, the leases (token, process group) a SIGSTOP froze with their worker."""
    store_outages: list[float] = field(default_factory=list)
    timeline: list[str] = field(default_factory=list)
    started: float = 0.0
    chaos_ended: float = 0.0
    finished: float = 0.0


def thread_ids(config: ChaosConfig) -> list[str]:
    return [f"t{i:04d}" for i in range(config.threads)]


def _counts(cluster: ChaosCluster) -> dict[Status, int] | None:
    """How many threads are in each status, or ``None`` while the store is unreachable
    (restarting)."""
    store = cluster.store
    try:
        return store.status_counts()
    except Exception as exc:
        if store.is_transient(exc):
            return None
        raise


def _all_finished(cluster: ChaosCluster, ids: list[str]) -> bool:
    counts = _counts(cluster)
    # The chaos threads and the reference thread, done before them.
    return counts is not None and sum(counts[s] for s in SETTLED) == len(ids) + 1


def leases_on(cluster: ChaosCluster, worker: WorkerProcess, ids: list[str]) -> dict[str, int]:
    """The threads whose lease is held by one of ``worker``'s processes, with the token.
    An owner is ``<host>:<pid>:<nonce>``."""
    held = {}
    for schedule in cluster.store.schedules(ids):
        if schedule.owner is not None and schedule.token is not None:
            _host, pid, _nonce = schedule.owner.rsplit(":", 2)
            if worker.owns(int(pid)):
                held[schedule.thread_id] = schedule.token
    return held


def run_reference(cluster: ChaosCluster, config: ChaosConfig, timeout: float = 120) -> Any:
    """Run one thread without any chaos: the result every chaos thread must reproduce."""
    cluster.agent.delay("reference", rounds=config.rounds, latency=config.latency)
    return cluster.agent.wait("reference", timeout=timeout)


def run_chaos(cluster: ChaosCluster, say: Say = print) -> ChaosLog:
    """Start the workers, the threads and the chaos; return once every thread finished
    (or ``finish_timeout`` passed after the chaos)."""
    config = cluster.config
    rng = random.Random(config.seed)
    log = ChaosLog()
    ids = thread_ids(config)

    def note(text: str) -> None:
        line = f"[{time.monotonic() - log.started:7.2f}s] {text}"
        log.timeline.append(line)
        say(line)

    log.started = time.monotonic()
    feeder = Feeder(cluster, ids)
    feeder.start()
    note(
        f"{len(ids)} threads of {config.steps_per_thread} steps arriving over "
        f"{config.arrival_seconds:.0f} s"
    )
    try:
        wait_until(
            lambda: (_counts(cluster) or {}).get(Status.RUNNING, 0) > 0,
            timeout=60,
            what="a thread running",
        )
        _chaos_loop(cluster, rng, log, ids, note)
        feeder.join()
    finally:
        feeder.abort()
    if feeder.errors:
        raise RuntimeError(f"could not enqueue every thread: {feeder.errors}")
    log.chaos_ended = time.monotonic()
    note("chaos over; waiting for the threads")
    with contextlib.suppress(TimeoutError):
        wait_until(
            lambda: _all_finished(cluster, ids),
            timeout=config.finish_timeout,
            interval=0.2,
            what="every thread finished",
        )
    log.finished = time.monotonic()
    note("threads finished" if _all_finished(cluster, ids) else "gave up waiting")
    return log


class Feeder:
    """Enqueues the threads evenly over ``arrival_seconds`` on a thread of its own."""

    def __init__(self, cluster: ChaosCluster, ids: list[str]) -> None:
        self.cluster = cluster
        self.ids = ids
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._feed, name="chaos-feeder", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        """Wait until every thread is enqueued."""
        self._thread.join()

    def abort(self) -> None:
        """Stop enqueueing (the run is being torn down)."""
        self._stop.set()
        self._thread.join()

    def _feed(self) -> None:
        config = self.cluster.config
        begin = time.monotonic()
        for i, thread_id in enumerate(self.ids):
            # Arrival pacing: load generation, not synchronisation.
            if self._stop.wait(
                max(0.0, begin + config.arrival_seconds * i / len(self.ids) - time.monotonic())
            ):
                return
            for attempt in range(50):
                try:
                    self.cluster.agent.delay(
                        thread_id, rounds=config.rounds, latency=config.latency
                    )
                    break
                except StoreUnavailable as exc:  # the store is restarting
                    if attempt == 49 or self._stop.wait(0.2):
                        self.errors.append(f"{thread_id}: {exc}")
                        return


def _busy_worker(
    cluster: ChaosCluster, ids: list[str], rng: random.Random
) -> tuple[WorkerProcess, dict[str, int]]:
    """A random worker among those driving threads (any worker if none is), with the
    threads it drives: killing or freezing an idle worker proves little."""
    held = {worker.name: leases_on(cluster, worker, ids) for worker in cluster.workers}
    busy = [worker for worker in cluster.workers if held[worker.name]]
    victim = rng.choice(busy or cluster.workers)
    return victim, held[victim.name]


def _chaos_loop(
    cluster: ChaosCluster, rng: random.Random, log: ChaosLog, ids: list[str], note: Say
) -> None:
    config = cluster.config
    # Every kind of action once, in a random order, then random ones.
    plan = list(ACTIONS)
    rng.shuffle(plan)
    deadline = log.started + config.chaos_seconds
    actions = 0
    while actions < config.max_actions and time.monotonic() < deadline:
        # Pacing between actions: load generation, not synchronisation.
        pause_until = time.monotonic() + rng.uniform(*config.pace)
        while time.monotonic() < pause_until and not _all_finished(cluster, ids):
            time.sleep(0.1)
        if _all_finished(cluster, ids):
            break
        action = plan.pop(0) if plan else rng.choice(ACTIONS)
        actions += 1
        if action == "kill":
            victim, held = _busy_worker(cluster, ids, rng)
            at = time.time()
            victim.kill()
            cluster.retire(victim)
            log.kills.append(KillEvent(at, held))
            note(f"SIGKILL {victim.name} (driving {len(held)}: {sorted(held)})")
            cluster.start_worker()
        elif action == "deploy":
            old = rng.choice(cluster.workers)
            new = cluster.start_worker()
            signalled = time.monotonic()
            old.terminate()
            wait_until(
                lambda w=old: not w.running,
                timeout=60,
                interval=0.01,
                what=f"{old.name} leaving after SIGTERM",
            )
            took = time.monotonic() - signalled
            cluster.retire(old)
            log.deploy_exits.append(took)
            note(f"deploy: SIGTERM {old.name}, exited in {took:.2f} s; {new.name} serves")
        elif action == "zombie":
            victim, _ = _busy_worker(cluster, ids, rng)
            victim.signal_group(signal.SIGSTOP)
            # Read once frozen: what it holds can no longer change, and each lease stays
            # in the store for a while yet.
            for thread_id, token in leases_on(cluster, victim, ids).items():
                log.frozen.setdefault(thread_id, set()).add(Arrival(token, victim.pid))
            note(f"SIGSTOP {victim.name} for {config.zombie_pause:.1f} s")
            time.sleep(config.zombie_pause)  # past the lease TTL: that is the point
            victim.signal_group(signal.SIGCONT)
            log.zombies += 1
            note(f"SIGCONT {victim.name}")
        else:
            began = time.monotonic()
            said = cluster.store_outage(rng.uniform(*config.store_down))
            log.store_outages.append(time.monotonic() - began)
            note(said)
    note(f"chaos over after {actions} actions")


# -- verification ------------------------------------------------------------------------------


@dataclass
class ChaosReport:
    figures: dict[str, float | int | str]
    problems: list[str]

    def lines(self) -> list[str]:
        return [f"figure {name} {value}" for name, value in self.figures.items()]


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3) if values else float("nan")


@dataclass
class _Tally:
    """What :func:`verify` finds across the threads, in the order it finds it."""

    problems: list[str] = field(default_factory=list)
    lost: int = 0
    duplicates: int = 0
    excused: int = 0
    """Second emails the known limit explains."""
    reruns: int = 0
    undecodable: int = 0


def verify(cluster: ChaosCluster, log: ChaosLog, reference: Any) -> ChaosReport:
    """Check every thread, effect and checkpoint; compute the figures."""
    config, store, ledger = cluster.config, cluster.store, cluster.ledger
    assert ledger is not None
    tally = _Tally()
    expected = _expected_effects(config)
    histories: dict[str, list[Any]] = {}
    finished: set[str] = set()
    stored = _stored_steps(cluster)
    for thread_id in thread_ids(config):
        meta = store.meta(thread_id)
        done = meta is not None and meta.status == Status.DONE
        _check_outcome(tally, thread_id, meta, reference)
        _check_effects(tally, thread_id, ledger, expected, done, log.frozen.get(thread_id, set()))
        steps = stored.get(thread_id, [])
        histories[thread_id] = _read_history(tally, store, thread_id, steps)
        if done:
            finished.add(thread_id)
            _check_history(tally, thread_id, steps, histories[thread_id], config)
    resumed = resume_times(log, histories)
    # A thread can end between the read of the victim's leases and the SIGKILL: its last
    # checkpoint, under the killed token, is then its final one and nothing resumes it.
    ended = sum(
        1
        for kill in log.kills
        for thread_id, token in kill.tokens.items()
        if thread_id in finished and histories[thread_id][-1].token == token
    )
    unresumed = sum(len(k.tokens) for k in log.kills) - len(resumed) - ended
    if unresumed:
        tally.problems.append(f"{unresumed} threads held by a killed worker never committed again")
    failed = logged(cluster, FAILED_TASK)
    if failed:
        tally.problems.append(f"{failed} tasks failed (the workers' logs say {FAILED_TASK!r})")
    return ChaosReport(_figures(cluster, log, tally, histories, resumed), tally.problems)


def _check_outcome(tally: _Tally, thread_id: str, meta: ThreadMeta | None, reference: Any) -> None:
    if meta is None or meta.status != Status.DONE:
        tally.lost += 1
        status = meta.status.value if meta else "missing"
        error = (meta.error or "").splitlines()[0] if meta and meta.error else ""
        tally.problems.append(
            f"{thread_id}: {status} at step {meta.step if meta else '-'}"
            f"{': ' + error if error else ''}"
        )
    elif meta.result != reference:
        tally.problems.append(f"{thread_id}: result {meta.result!r} != reference {reference!r}")


def _expected_effects(config: ChaosConfig) -> dict[str, int | str]:
    expected: dict[str, int | str] = {}
    for n in range(1, config.rounds + 1):
        expected[f"refund:call-refund-{n}"] = 10 * n
        expected[f"notify:call-notify-{n}"] = f"c{n}@ex.com"
    return expected


def _check_effects(
    tally: _Tally,
    thread_id: str,
    ledger: ChaosLedger,
    expected: dict[str, int | str],
    done: bool,
    frozen: set[Arrival],
) -> None:
    """The outside world: every effect applied once, no tool call made twice unless the
    tool is declared idempotent."""
    # The tools see the keys as sent downstream; name them by effect key again.
    named = {}
    for name in expected:
        tool, key = name.split(":", 1)
        named[f"{tool}:{ledger.sent(thread_id, key)}"] = name
    effects = {named.get(k, k): json.loads(v) for k, v in ledger.effects(thread_id).items()}
    if done and effects != expected:
        tally.problems.append(f"{thread_id}: effects {effects} != {expected}")
    excusable = set(frozen)  # each frozen lease excuses one call, across the thread's keys
    for sent, calls in ledger.arrivals(thread_id).items():
        name, count = named.get(sent, sent), len(calls)
        if name not in expected:
            tally.problems.append(f"{thread_id}: unexpected tool call {name}")
        elif name.startswith("notify:") and count > 1:  # not idempotent: an email twice
            # The known limit (README, "Limits"): a worker frozen between its lease check
            # and the call makes it late, after another worker took the thread over and
            # made it with a newer token. Any other second email is a duplicate.
            excused = frozen_calls(calls, excusable)
            excusable -= set(excused)
            tally.excused += len(excused)
            if count - len(excused) > 1:
                tally.duplicates += count - len(excused) - 1
                tally.problems.append(f"{thread_id}: {name} ran {count} times: {calls}")
        elif count > 1:
            tally.reruns += count - 1


def frozen_calls(calls: list[Arrival], frozen: set[Arrival]) -> list[Arrival]:
    """The calls among ``calls`` that the known limit explains: each made under a lease
    ``frozen`` lists (its token, its worker's process group), which a SIGSTOP froze, while
    another call carries a newer token; one per frozen lease."""
    newest = max(call.token for call in calls)
    excused: list[Arrival] = []
    for call in calls:
        if call in frozen and call.token < newest and call not in excused:
            excused.append(call)
    return excused


def _stored_steps(cluster: ChaosCluster) -> dict[str, list[int]]:
    """The steps of every thread's stored checkpoints, read beside the store's API: the
    rows of the SQLite file, or the checkpoint keys found by one walk of the keyspace
    (one walk per thread costs the keyspace times the threads)."""
    steps: dict[str, list[int]] = {}
    store = cluster.store
    if not isinstance(store, RedisStore):
        with contextlib.closing(sqlite3.connect(cluster.database)) as db:
            for thread_id, step in db.execute("SELECT thread_id, step FROM checkpoints"):
                steps.setdefault(thread_id, []).append(step)
        return steps
    thread_part, checkpoint_part = store.keys.checkpoint_prefix("\n").split("\n")
    pattern = f"{thread_part}*{checkpoint_part}*"
    for key in store.client.scan_iter(match=pattern, count=1000):
        thread_id, _, step = key.decode()[len(thread_part) :].rpartition(checkpoint_part)
        steps.setdefault(thread_id, []).append(int(step))
    return steps


def _read_history(tally: _Tally, store: Store, thread_id: str, steps: list[int]) -> list[Any]:
    """Every checkpoint of ``steps``, the thread's stored steps, that decodes."""
    history = []
    for step in sorted(steps):
        try:
            history.append(store.checkpoint(thread_id, step))
        except AgentqError as exc:
            tally.undecodable += 1
            tally.problems.append(f"{thread_id}: checkpoint {step} does not decode: {exc}")
    return history


def _check_history(
    tally: _Tally, thread_id: str, steps: list[int], history: list[Any], config: ChaosConfig
) -> None:
    """A finished thread's history is whole, in order, fenced."""
    want = list(range(config.steps_per_thread))
    if sorted(steps) != want:
        tally.problems.append(f"{thread_id}: stored steps {sorted(steps)} != {want}")
    tokens = [c.token for c in history]
    if tokens != sorted(tokens):
        tally.problems.append(f"{thread_id}: tokens decrease along the steps: {tokens}")
    if history and history[-1].node is not None:
        tally.problems.append(
            f"{thread_id}: done, but the last checkpoint goes on to {history[-1].node!r}"
        )


def _figures(
    cluster: ChaosCluster,
    log: ChaosLog,
    tally: _Tally,
    histories: dict[str, list[Any]],
    resumed: list[float],
) -> dict[str, float | int | str]:
    config, ledger = cluster.config, cluster.ledger
    assert ledger is not None
    return {
        "threads": config.threads,
        "steps": config.steps_per_thread,
        "kills": len(log.kills),
        "deploys": len(log.deploy_exits),
        "zombies": log.zombies,
        "store_restarts": len(log.store_outages),
        "lost": tally.lost,
        "duplicate_effects": tally.duplicates,
        "frozen_worker_calls": tally.excused,
        "sigkill_to_resumed_median_s": _median(resumed),
        "sigkill_to_resumed_max_s": round(max(resumed), 3) if resumed else float("nan"),
        "threads_hit_by_sigkill": sum(len(k.tokens) for k in log.kills),
        "most_threads_hit_by_one_sigkill": max((len(k.tokens) for k in log.kills), default=0),
        "sigterm_to_exit_max_s": round(max(log.deploy_exits), 3)
        if log.deploy_exits
        else float("nan"),
        "store_outage_median_s": _median(log.store_outages),
        "idempotent_reruns": tally.reruns,
        "undecodable_checkpoints": tally.undecodable,
        "checkpoints": sum(len(h) for h in histories.values()),
        "model_calls": sum(ledger.model_calls(t) for t in thread_ids(config)),
        "model_calls_uninterrupted": config.threads * (config.rounds + 1),
        "fenced_zombie_stops": fenced_stops(cluster),
        "failed_tasks": logged(cluster, FAILED_TASK),
        "run_s": round(log.finished - log.started, 1),
    }


def resume_times(log: ChaosLog, histories: dict[str, list[Any]]) -> list[float]:
    """For each thread a SIGKILLed worker held, the time from the kill to the first
    checkpoint written under a newer fencing token (the next driver's first commit)."""
    times = []
    for kill in log.kills:
        for thread_id, token in kill.tokens.items():
            later = [c.created_at for c in histories.get(thread_id, []) if c.token > token]
            if later:
                times.append(min(later) - kill.at)
    return times


def logged(cluster: ChaosCluster, needle: str) -> int:
    """How many times the workers' logs say ``needle``."""
    return sum(
        path.read_text(errors="replace").count(needle) for path in cluster.log_dir.glob("*.log")
    )


def fenced_stops(cluster: ChaosCluster) -> int:
    """How often a driver found out it had been fenced out (a zombie's refused write)."""
    return logged(cluster, "another worker drives it now")


FAILED_TASK: Final = "raised unexpected"
"""Celery's line for a task that failed: no fault of these should fail one, as every
thread is carried on to the end."""


def run_and_verify(cluster: ChaosCluster, say: Say = print) -> ChaosReport:
    """The whole run: workers, an uninterrupted reference thread, chaos, verification."""
    config = cluster.config
    for _ in range(config.workers):
        cluster.start_worker()
    say(
        f"{config.workers} workers -P {config.pool} -c {config.concurrency} "
        f"({'async' if config.async_nodes else 'sync'} nodes) "
        f"on queue {cluster.queue}; "
        f"store {cluster.server.url}; logs in {cluster.log_dir}"
    )
    reference = run_reference(cluster, config)
    say(f"reference (uninterrupted) result: {reference}")
    log = run_chaos(cluster, say)
    return verify(cluster, log, reference)
