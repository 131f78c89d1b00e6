"""Fleet-wide limits against Celery's per-worker ``rate_limit``, on one fake provider.

The provider (:mod:`bench._limits_app`) lets ``rpm`` requests a minute through and answers
the rest with a 429 and ``Retry-After``. Workers (``-P threads``) run threads of ``calls``
calls each: once as agents taking from an agentq limit of that budget, once as plain
Celery tasks, one per call, under ``rate_limit`` = budget ÷ workers, the same budget split
as Celery must. Rows: 429s after the first second, calls a minute ÷ the provider's limit,
pool slots busy while calls go through (waiting, nearly all of them), and two tenants
capped 3:1 sharing it.

    python -m bench.limits [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis
from celery import Celery

from bench._cluster import BROKER, Worker, _delete_queue, broker_problem, wait_for
from bench._limits_app import make_app
from bench._redis import PrivateRedis
from bench._report import Result, Target, report, skipped


@dataclass(frozen=True)
class Size:
    rpm: float
    workers: int
    threads: int
    calls: int


QUICK = Size(rpm=1200, workers=2, threads=10, calls=3)
FULL = Size(rpm=600, workers=4, threads=50, calls=10)


@dataclass
class Fleet:
    app: Celery
    ledger: redis.Redis
    ns: str

    def times(self, what: str) -> list[float]:
        return sorted(float(t) for t in self.ledger.lrange(f"{self.ns}:{what}", 0, -1))

    def count(self, what: str) -> int:
        return int(self.ledger.llen(f"{self.ns}:{what}"))


@contextlib.contextmanager
def fleet(size: Size, store: str, ledger: PrivateRedis, logs: Path) -> Iterator[Fleet]:
    prefix = f"l{uuid.uuid4().hex[:8]}:"
    env = {
        "BENCH_BROKER": BROKER,
        "BENCH_STORE": store,
        "BENCH_LEDGER": f"redis://127.0.0.1:{ledger.port}/0",
        "BENCH_PREFIX": prefix,
        "BENCH_QUEUE": f"agentq-bench-limits-{prefix}",
        "BENCH_RPM": str(size.rpm),
        "BENCH_WORKERS": str(size.workers),
    }
    app = make_app(env)
    workers = [
        Worker(app, env, logs / f"{prefix}{i}.log", size.threads, "threads", "bench._limits_app")
        for i in range(size.workers)
    ]
    try:
        for worker in workers:
            worker.start()
        with contextlib.closing(ledger.client()) as client:
            yield Fleet(app, client, prefix.rstrip(":"))
    finally:
        for worker in workers:
            worker.stop()
        _delete_queue(app, env["BENCH_QUEUE"])
        app.close()


@dataclass(frozen=True)
class Measured:
    late_429s: int
    per_minute: float
    busy_slots: float
    """Pool slots running a task, on average while calls went through: a call takes a few
    milliseconds, so nearly all of them wait on the budget."""


def measure(fleet: Fleet, total: int, timeout: float) -> Measured:
    """429s after the first second of calls, calls a minute and busy pool slots, once
    ``total`` calls went through."""
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        # The client is safe to share between threads: each command takes a pooled connection.
        while not done.wait(0.1):
            if fleet.count("ok"):
                samples.append(int(fleet.ledger.get(f"{fleet.ns}:active") or 0))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        wait_for(lambda: fleet.count("ok") >= total, timeout, f"{total} calls", 0.05)
    finally:
        done.set()
        sampler.join()
    ok, refused = fleet.times("ok"), fleet.times("refused")
    late = sum(1 for t in refused if t > ok[0] + 1)
    busy = statistics.fmean(samples) if samples else 0.0
    return Measured(late, (len(ok) - 1) / (ok[-1] - ok[0]) * 60, busy)


def run(quick: bool) -> list[Result]:
    problem = broker_problem()
    if problem:
        return [skipped("ratio", "limits_rate_vs_provider", "limits", problem)]
    size = QUICK if quick else FULL
    total = size.workers * size.threads * size.calls
    timeout = total / size.rpm * 60 * 3 + 60
    with (
        PrivateRedis() as store_server,
        PrivateRedis("--appendonly", "no") as ledger,
        tempfile.TemporaryDirectory(prefix="agentq-bench-") as logs,
    ):
        store = f"redis://127.0.0.1:{store_server.port}/0"
        with fleet(size, store, ledger, Path(logs)) as ours:
            agent = ours.app.tasks["bench.limited_calls"]
            for i in range(size.workers * size.threads):
                agent.delay(f"calls-{i}", calls=size.calls)
            our = measure(ours, total, timeout)
        with fleet(size, store, ledger, Path(logs)) as theirs:
            task = theirs.app.tasks["bench.rate_limited_call"]
            for _ in range(total):
                task.delay()
            their = measure(theirs, total, timeout)
        with fleet(size, store, ledger, Path(logs)) as shared:
            agent = shared.app.tasks["bench.limited_calls"]
            each = size.threads * size.calls // 2
            for tenant in ("a", "b"):
                for i in range(size.threads // 2):
                    agent.delay(f"{tenant}-{i}", calls=size.calls, tenant=tenant)

            def tenant_calls(tenant: str) -> int:
                return int(shared.ledger.get(f"{shared.ns}:ok:{tenant}") or 0)

            wait_for(lambda: tenant_calls("a") >= each * 0.9, timeout, "tenant a's calls", 0.01)
            fairness = tenant_calls("a") / max(tenant_calls("b"), 1)
    our_late, our_rate, their_late, their_rate = (
        our.late_429s,
        our.per_minute,
        their.late_429s,
        their.per_minute,
    )
    budget = f"{size.rpm:g}/min"
    shape = f"{size.workers} workers x {size.threads} threads x {size.calls} calls"
    return [
        Result(
            "figure",
            "limits_429s_after_first_second",
            our_late,
            f"429s after the first second, {shape}, provider {budget}",
            f"{our_late}",
            f"Celery rate_limit ÷ workers: {their_late}",
            Target(0),
        ),
        Result(
            "figure",
            "limits_celery_429s_after_first_second",
            their_late,
            "same, Celery's per-worker rate_limit",
        ),
        Result(
            "ratio",
            "limits_rate_vs_provider",
            our_rate / size.rpm,
            "calls/min achieved ÷ the provider's limit",
            f"{our_rate:.0f}/min",
            f"Celery rate_limit {their_rate:.0f}/min ({their_rate / size.rpm:.2f})",
            Target(0.95, at_most=False),
        ),
        Result(
            "ratio",
            "limits_celery_rate_vs_provider",
            their_rate / size.rpm,
            "same, Celery's per-worker rate_limit",
        ),
        Result(
            "figure",
            "limits_busy_pool_slots",
            our.busy_slots,
            f"pool slots busy on average, of {size.workers * size.threads}",
            f"{our.busy_slots:.1f}",
            f"Celery rate_limit: {their.busy_slots:.1f}",
        ),
        Result(
            "figure",
            "limits_celery_busy_pool_slots",
            their.busy_slots,
            "same, Celery's per-worker rate_limit",
        ),
        Result(
            "ratio",
            "limits_tenant_fairness",
            fairness,
            "calls of tenant capped 3 ÷ tenant capped 1, while both wait",
            note="target 3 ± 10%",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.limits", description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    started = time.monotonic()
    report(run(args.quick))
    print(f"# {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
