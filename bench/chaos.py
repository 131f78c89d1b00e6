"""Chaos at full size: many agent threads on real workers while workers are SIGKILLed,
deployed (SIGTERM), frozen past their lease (SIGSTOP) and the store is SIGKILLed and
restarted on its AOF (with ``--store sqlite``: its write lock held by another process).
The same machinery as ``tests/chaos/test_chaos.py``
(:mod:`tests.support.chaos`), larger.

Run from the repository root::

    python -m bench.chaos [--threads 100 --steps 10 --workers 3 --pool prefork --concurrency 4]

Needs ``redis-server`` on PATH (a private one is started and removed) and the machine's
Redis on 127.0.0.1:6379 as the broker (a queue of the run's own, purged at the end).
Prints the chaos timeline, any problem found, and ends with ``figure <name> <value>``
lines. Exits 1 if a thread was lost, an effect duplicated or a history damaged.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from bench._cluster import BROKER
from tests.support.chaos import ChaosConfig, chaos_cluster, run_and_verify


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chaos",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--threads", type=int, default=100)
    parser.add_argument("--steps", type=int, default=10, help="per thread, at least 8")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--pool", choices=("prefork", "threads", "gevent"), default="prefork")
    parser.add_argument("--concurrency", type=int, default=4, help="pool slots per worker (-c)")
    parser.add_argument(
        "--async-nodes", action="store_true", help="async def model and tools nodes"
    )
    parser.add_argument(
        "--latency", type=float, default=1.0, help="seconds per model step; a tool call takes half"
    )
    parser.add_argument(
        "--arrival",
        type=float,
        default=None,
        help="seconds over which the threads arrive (default 1.5 per thread)",
    )
    parser.add_argument("--lease-ttl", type=float, default=2.0)
    parser.add_argument(
        "--store",
        choices=("redis", "sqlite"),
        default="redis",
        help="where the threads are kept: the private redis-server, or a SQLite file",
    )
    parser.add_argument("--max-actions", type=int, default=80)
    parser.add_argument(
        "--chaos-seconds",
        type=float,
        default=None,
        help="no chaos action starts after this (default: arrival + 60 s)",
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the worker logs and the store")
    args = parser.parse_args(argv)
    arrival = args.arrival if args.arrival is not None else 1.5 * args.threads
    config = ChaosConfig(
        threads=args.threads,
        steps=args.steps,
        workers=args.workers,
        pool=args.pool,
        concurrency=args.concurrency,
        async_nodes=args.async_nodes,
        latency=args.latency,
        arrival_seconds=arrival,
        lease_ttl=args.lease_ttl,
        max_actions=args.max_actions,
        chaos_seconds=args.chaos_seconds if args.chaos_seconds is not None else arrival + 60,
        finish_timeout=120.0,
        seed=args.seed,
        store=args.store,
        broker=BROKER,
    )
    workdir = Path(tempfile.mkdtemp(prefix="agentq-chaos-"))
    failed = True
    try:
        with chaos_cluster(config, workdir) as cluster:
            report = run_and_verify(cluster)
        for problem in report.problems:
            print(f"PROBLEM {problem}")
        failed = bool(report.problems)
        print("\n".join(report.lines()))
    finally:
        if args.keep or failed:
            print(f"logs and store kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
