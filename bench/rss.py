"""Whether a worker process grows with the runs it has made: its RSS after 10 000 short
agent runs against after 100.

Run from the repository root::

    python -m bench.rss [--quick]

One ``celery worker -P prefork -c 1`` subprocess (see :mod:`bench._cluster`) runs
``OneStepAgent`` threads (a whole run is one step and one commit), sent in batches with at
most a few hundred in flight. When exactly 100 runs (``--quick``: also 100) have finished,
and again after 10 000 (``--quick``: 1000), the pool process's ``VmRSS`` is read from
``/proc/<pid>/status``; the pool PID comes from the worker itself (``inspect().stats()``).
Target: RSS after 10 000 ÷ after 100 ≤ 1.1.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench._cluster import Cluster, broker_problem, cluster, wait_for
from bench._report import Result, Target, exit_with, size, skipped, standalone

TARGET = Target(1.1)
FIRST = 100
TOTAL = {False: 10_000, True: 1000}
BATCH = 100
IN_FLIGHT = 400


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def run_until(env: Cluster, total: int, sent: int) -> int:
    """Send one-step runs until ``total`` were sent, then wait for all; return ``total``."""
    agent = env.task("bench.one_step_agent")
    while sent < total:
        if sent - env.done_threads() < IN_FLIGHT:
            for k in range(sent, min(total, sent + BATCH)):
                agent.delay(f"rss-{k}", question=f"question {k}")
            sent = min(total, sent + BATCH)
        else:
            time.sleep(0.01)
    wait_for(lambda: env.done_threads() >= total, 600, f"{total} runs done", interval=0.02)
    return total


def run(quick: bool) -> list[Result]:
    name, what = "rss_after_many_over_100", f"worker RSS after {TOTAL[quick]} runs ÷ after 100"
    problem = broker_problem()
    if problem:
        return [skipped("ratio", name, what, problem)]
    with cluster(concurrency=1) as env:
        (pid,) = env.worker.pool_pids()
        sent = run_until(env, FIRST, 0)
        first = rss_bytes(pid)
        started = time.perf_counter()
        run_until(env, TOTAL[quick], sent)
        rate = (TOTAL[quick] - FIRST) / (time.perf_counter() - started)
        last = rss_bytes(pid)
        same = env.worker.pool_pids() == [pid]
    note = f"{rate:.0f} runs/s" + ("" if same else "; the pool process was replaced!")
    return [Result("ratio", name, last / first, what, size(last), size(first), TARGET, note)]


def main(argv: list[str] | None = None) -> int:
    return standalone("python -m bench.rss", __doc__, run, argv)


if __name__ == "__main__":
    exit_with(main)
