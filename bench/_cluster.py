"""A store, a ledger, a broker queue and one ``celery worker`` subprocess, for a benchmark.

The store is a private redis-server with AOF always; the ledger a private one without
persistence (tasks count their completions there); the broker the machine's Redis
(``AGENTQ_BENCH_BROKER``, default ``redis://127.0.0.1:6379/0``) with a queue of the run's
own, deleted at the end. The worker is started in its own session and stopped by its PID:
warm shutdown at the end of a run (SIGKILL of its process group if it lingers), SIGKILL of
the group at once on an error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from agentq.store.redis.store import RedisStore
from bench._agents import make_app
from bench._redis import PrivateRedis

ROOT = Path(__file__).resolve().parents[1]
BROKER = os.environ.get("AGENTQ_BENCH_BROKER", "redis://127.0.0.1:6379/0")
READY_DEADLINE = 60.0
STOP_DEADLINE = 15.0


def broker_problem() -> str | None:
    """Why the broker cannot be used, or ``None`` when it answers."""
    try:
        with contextlib.closing(redis.Redis.from_url(BROKER, socket_connect_timeout=2)) as c:
            c.ping()
    except redis.RedisError as exc:
        return f"broker {BROKER} not reachable ({exc})"
    return None


def wait_for(
    predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.005
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)


class Worker:
    """``celery -A bench._worker_app worker -P <pool> -c N`` in its own session."""

    def __init__(
        self,
        app: Celery,
        env: dict[str, str],
        log: Path,
        concurrency: int,
        pool: str = "prefork",
        app_module: str = "bench._worker_app",
    ) -> None:
        self.app = app
        self.env = env
        self.log = log
        self.concurrency = concurrency
        self.pool = pool
        self.app_module = app_module
        self.name = f"bench{uuid.uuid4().hex[:6]}@agentq"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Worker:
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    self.app_module,
                    "worker",
                    "-P",
                    self.pool,
                    "-c",
                    str(self.concurrency),
                    "-n",
                    self.name,
                    "-Q",
                    self.env["BENCH_QUEUE"],
                    "--without-mingle",
                    "--without-gossip",
                    "--loglevel",
                    "WARNING",
                ],
                cwd=ROOT,
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(self._answers, READY_DEADLINE, f"worker {self.name} answering ping", 0.2)
        return self

    def _answers(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(
                f"worker exited with {self.process.returncode}:\n"
                + self.log.read_text(errors="replace")[-3000:]
            )
        return bool(self.app.control.ping(destination=[self.name], timeout=0.5))

    def pool_pids(self) -> list[int]:
        """The prefork children's PIDs, as the worker reports them."""
        stats = self.app.control.inspect([self.name], timeout=5).stats() or {}
        return [int(pid) for pid in stats[self.name]["pool"]["processes"]]

    def stop(self) -> None:
        """Warm shutdown (the queue is empty by now), SIGKILL if it lingers."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=STOP_DEADLINE)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the worker and its pool (its session's process group) at once."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=STOP_DEADLINE)


@dataclass
class Cluster:
    app: Celery
    store: RedisStore
    store_client: redis.Redis
    ledger: redis.Redis
    worker: Worker
    run_id: str

    def task(self, name: str) -> Any:
        return self.app.tasks[name]

    def done_threads(self) -> int:
        return int(self.store_client.zcard(self.store.keys.status_index("done")))

    def count(self, counter: str) -> int:
        return int(self.ledger.get(counter) or 0)


def _delete_queue(app: Celery, queue: str) -> None:
    """Remove the queue and its bindings from the broker. kombu's Redis transport deletes
    only the bindings its channel knows of, hence declare first."""
    try:
        with app.connection_for_write() as conn:
            bound = app.amqp.queues[queue].bind(conn.default_channel)
            bound.declare()
            bound.delete()
    except Exception as exc:  # the run's results stand; say what is left behind
        print(f"warning: could not delete broker queue {queue}: {exc}", file=sys.stderr)


@contextlib.contextmanager
def cluster(concurrency: int) -> Iterator[Cluster]:
    """Everything a worker benchmark needs, stopped and removed at the end."""
    run_id = uuid.uuid4().hex[:8]
    queue = f"agentq-bench-{run_id}"
    with contextlib.ExitStack() as stack:
        store_server = stack.enter_context(PrivateRedis())
        ledger_server = stack.enter_context(PrivateRedis("--appendonly", "no"))
        store_url = f"redis://127.0.0.1:{store_server.port}/0"
        ledger_url = f"redis://127.0.0.1:{ledger_server.port}/0"
        env = {
            "BENCH_BROKER": BROKER,
            "BENCH_STORE": store_url,
            "BENCH_LEDGER": ledger_url,
            "BENCH_PREFIX": f"b{run_id}:",
            "BENCH_QUEUE": queue,
        }
        app = make_app(
            broker=BROKER,
            store=store_url,
            ledger=ledger_url,
            prefix=env["BENCH_PREFIX"],
            queue=queue,
        )
        stack.callback(app.close)
        stack.callback(_delete_queue, app, queue)
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="agentq-bench-")))
        worker = Worker(app, env, logs / "worker.log", concurrency)
        stack.callback(worker.stop)
        worker.start()
        store = app._agentq_runtime.store
        assert isinstance(store, RedisStore)
        store_client = store.client
        assert isinstance(store_client, redis.Redis)
        ledger = stack.enter_context(contextlib.closing(ledger_server.client()))
        try:
            yield Cluster(app, store, store_client, ledger, worker, run_id)
        except BaseException:
            worker.kill()  # interrupted or failed: nothing in flight is worth waiting for
            raise
