"""How fast a thread moves on when its worker dies or is deployed away, against plain Celery.

Run from the repository root::

    python -m bench.recovery [--samples 3] [--lease-ttl 5] [--step 1] [--plain-wait 30]

Two ``celery worker`` subprocesses (prefork, one process each) on the machine's Redis
(127.0.0.1:6379, a queue of the run's own) share a private store ``redis-server``; agentq
runs with ``lease_ttl`` 5 s. A thread of :class:`~tests.support.agents.ChaosAgent` whose
steps take ``--step`` seconds runs on one worker; mid-step, that worker is

- SIGKILLed (whole process group): measured, the time to the thread's next step *starting*
  on the other worker (a node start is recorded in the ledger with its pid and time);
- SIGTERMed (main process, as a deploy): measured, the time until the thread is handed
  over (status ``queued``), until the worker process exits, and until the next step starts
  on the other worker. An idle worker's SIGTERM-to-exit is measured too: Celery's own floor.

Then the same SIGKILL for a plain Celery task (``acks_late=True``, default settings, Redis
broker) while the second worker idles: its message sits in the broker's unacked set until
``visibility_timeout`` (3600 s by default) and is not redelivered within ``--plain-wait``.

Targets (printed, not asserted): SIGKILL->resumed <= lease TTL + 2 s; SIGTERM->exit <= one
step; SIGTERM->resumed <= 1 s. Ends with one ``figure``/``ratio`` line per result.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from agentq import Status
from bench._cluster import BROKER
from bench._report import Result, Target, machine_line, report
from tests.support.chaos import ChaosCluster, ChaosConfig, chaos_cluster, leases_on
from tests.support.redis_server import wait_until
from tests.support.workers import WorkerProcess

ROUNDS = 30
"""Steps enough that the thread is still running when each measurement ends."""


def _holder(cluster: ChaosCluster, thread_id: str) -> WorkerProcess:
    def find() -> WorkerProcess | None:
        for worker in cluster.workers:
            if leases_on(cluster, worker, [thread_id]):
                return worker
        return None

    found = wait_until(find, timeout=60, what=f"the worker driving {thread_id}")
    assert isinstance(found, WorkerProcess)
    return found


def _started_elsewhere(
    cluster: ChaosCluster, thread_id: str, gone: WorkerProcess, after: float
) -> float | None:
    """The time the first node start after ``after`` was recorded outside ``gone``."""
    assert cluster.ledger is not None
    for start in cluster.ledger.starts(thread_id):
        if start["t"] > after and not gone.owns(start["pid"]):
            return float(start["t"])
    return None


def _mid_step(cluster: ChaosCluster, thread_id: str, step: float) -> None:
    """Return half a step after a node of the thread started (past its first two)."""
    assert cluster.ledger is not None
    ledger = cluster.ledger
    wait_until(lambda: len(ledger.starts(thread_id)) >= 3, timeout=60, what="three steps")
    seen = len(ledger.starts(thread_id))
    wait_until(lambda: len(ledger.starts(thread_id)) > seen, timeout=60, what="a new step")
    time.sleep(step / 2)  # the signal lands mid-step: a load pattern, not synchronisation


def _finish(cluster: ChaosCluster, thread_id: str) -> None:
    """Cancel the thread so that its worker is free for the next sample."""
    cluster.agent.cancel(thread_id)
    wait_until(
        lambda: cluster.agent.thread(thread_id).status == Status.CANCELLED,
        timeout=60,
        what=f"{thread_id} cancelled",
    )


def _two_workers(cluster: ChaosCluster) -> None:
    while len(cluster.workers) < 2:
        cluster.start_worker()


def sigkill_samples(cluster: ChaosCluster, samples: int, step: float) -> list[float]:
    times = []
    for i in range(samples):
        _two_workers(cluster)
        thread_id = f"kill{i}"
        cluster.agent.delay(thread_id, rounds=ROUNDS, latency=step)
        _mid_step(cluster, thread_id, step)
        victim = _holder(cluster, thread_id)
        killed_at = time.time()
        victim.kill()
        cluster.retire(victim)
        resumed = wait_until(
            lambda t=thread_id, v=victim, k=killed_at: _started_elsewhere(cluster, t, v, k),
            timeout=120,
            interval=0.01,
            what=f"{thread_id} resumed",
        )
        times.append(resumed - killed_at)
        print(f"  SIGKILL sample {i + 1}: next step started {times[-1]:.2f} s later")
        _finish(cluster, thread_id)
    return times


def sigterm_samples(
    cluster: ChaosCluster, samples: int, step: float
) -> tuple[list[float], list[float], list[float]]:
    handovers, exits, resumes = [], [], []
    for i in range(samples):
        _two_workers(cluster)
        thread_id = f"term{i}"
        cluster.agent.delay(thread_id, rounds=ROUNDS, latency=step)
        _mid_step(cluster, thread_id, step)
        leaving = _holder(cluster, thread_id)
        token = leases_on(cluster, leaving, [thread_id])[thread_id]
        signalled_at, signalled = time.time(), time.monotonic()
        leaving.terminate()
        exited = resumed = None
        deadline = signalled + 120
        while (exited is None or resumed is None) and time.monotonic() < deadline:
            if exited is None and not leaving.running:
                exited = time.monotonic() - signalled
            if resumed is None:
                at = _started_elsewhere(cluster, thread_id, leaving, signalled_at)
                resumed = None if at is None else at - signalled_at
            time.sleep(0.005)  # polling two clocks at once, under the deadline above
        if exited is None or resumed is None:
            raise TimeoutError(f"{thread_id}: exit {exited}, resume {resumed} after SIGTERM")
        # The handover follows the commit of the step in flight, the leaving driver's last.
        last = max(
            c.created_at for c in cluster.store.history(thread_id, limit=1000) if c.token == token
        )
        handed_over = last - signalled_at
        cluster.retire(leaving)
        handovers.append(handed_over)
        exits.append(exited)
        resumes.append(resumed)
        print(
            f"  SIGTERM sample {i + 1}: handed over {handed_over:.2f} s, worker exited "
            f"{exited:.2f} s, next step started {resumed:.2f} s after the signal"
        )
        _finish(cluster, thread_id)
    return handovers, exits, resumes


def idle_exit(cluster: ChaosCluster) -> float:
    """SIGTERM to exit of a worker running nothing: what Celery's shutdown costs alone."""
    worker = cluster.start_worker()
    signalled = time.monotonic()
    worker.terminate()
    wait_until(lambda: not worker.running, timeout=60, interval=0.005, what="idle exit")
    cluster.retire(worker)
    return time.monotonic() - signalled


def plain_celery(cluster: ChaosCluster, wait: float) -> float | None:
    """SIGKILL the worker running a plain ``acks_late`` task; the seconds until it starts
    again anywhere, or ``None`` if not within ``wait``."""
    assert cluster.app is not None and cluster.ledger is not None
    ledger = cluster.ledger
    _two_workers(cluster)
    cluster.app.send_task("tests.plain_task", args=("plain", 3600.0))
    start = wait_until(lambda: ledger.starts("plain"), timeout=60, what="the plain task")[0]
    victim = next(w for w in cluster.workers if w.owns(start["pid"]))
    killed_at = time.time()
    victim.kill()
    cluster.retire(victim)
    with contextlib.suppress(TimeoutError):
        again = wait_until(
            lambda: len(ledger.starts("plain")) > 1, timeout=wait, interval=0.1, what="a redelivery"
        )
        if again:
            return float(ledger.starts("plain")[1]["t"]) - killed_at
    return None


def run(
    quick: bool = False,
    *,
    samples: int | None = None,
    lease_ttl: float = 5.0,
    step: float = 1.0,
    plain_wait: float | None = None,
) -> list[Result]:
    samples = samples or (1 if quick else 3)
    plain_wait = plain_wait if plain_wait is not None else (15.0 if quick else 30.0)
    config = ChaosConfig(
        threads=1, workers=2, concurrency=1, lease_ttl=lease_ttl, latency=step, broker=BROKER
    )
    workdir = Path(tempfile.mkdtemp(prefix="agentq-recovery-"))
    try:
        with chaos_cluster(config, workdir) as cluster:
            print(f"lease_ttl {lease_ttl} s, steps of {step} s, {samples} sample(s) each")
            kills = sigkill_samples(cluster, samples, step)
            handovers, exits, resumes = sigterm_samples(cluster, samples, step)
            idle = idle_exit(cluster)
            print(f"  idle worker: SIGTERM to exit {idle:.2f} s")
            plain = plain_celery(cluster, plain_wait)
            print(
                "  plain Celery: "
                + (
                    f"redelivered after {plain:.2f} s"
                    if plain is not None
                    else f"not redelivered within {plain_wait:.0f} s"
                )
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    n = f"median of {samples}"
    kill_target = lease_ttl + 2
    return [
        Result(
            "figure",
            "sigkill_to_resumed_s",
            statistics.median(kills),
            "SIGKILL -> next step starts on another worker, s",
            n,
            f"lease {lease_ttl} s",
            Target(kill_target),
        ),
        Result(
            "figure",
            "sigkill_to_resumed_max_s",
            max(kills),
            "SIGKILL -> next step starts on another worker (max), s",
            f"max of {samples}",
            f"lease {lease_ttl} s",
            Target(kill_target),
        ),
        Result(
            "figure",
            "sigterm_to_handover_s",
            statistics.median(handovers),
            "SIGTERM -> thread handed over (queued), s",
            n,
            f"step {step} s",
            Target(step),
        ),
        Result(
            "figure",
            "sigterm_to_exit_s",
            statistics.median(exits),
            "SIGTERM -> worker process exits, s",
            n,
            f"step {step} s",
            Target(step),
            note=f"Celery's idle shutdown alone takes {idle:.2f} s",
        ),
        Result(
            "figure",
            "celery_idle_sigterm_to_exit_s",
            idle,
            "SIGTERM -> exit of an idle worker (Celery alone), s",
            "1 run",
            "",
        ),
        Result(
            "figure",
            "sigterm_to_resumed_s",
            statistics.median(resumes),
            "SIGTERM -> next step starts on another worker, s",
            n,
            f"step {step} s",
            Target(1.0),
        ),
        Result(
            "figure",
            "plain_celery_sigkill_to_redelivered_s",
            math.inf if plain is None else plain,
            "plain Celery acks_late task: SIGKILL -> redelivered, s",
            "1 run",
            "visibility_timeout 3600 s",
            note=f"not within {plain_wait:.0f} s" if plain is None else "",
        ),
        Result(
            "ratio",
            "sigkill_to_resumed_vs_lease_ttl",
            statistics.median(kills) / lease_ttl,
            "SIGKILL -> resumed / lease TTL",
            n,
            f"lease {lease_ttl} s",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.recovery", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="1 sample each, 15 s plain wait")
    parser.add_argument("--samples", type=int, default=None, help="per scenario (default 3)")
    parser.add_argument("--lease-ttl", type=float, default=5.0)
    parser.add_argument("--step", type=float, default=1.0, help="seconds per agent step")
    parser.add_argument(
        "--plain-wait",
        type=float,
        default=None,
        help="seconds to wait for plain Celery's redelivery (default 30)",
    )
    args = parser.parse_args(argv)
    print(machine_line())
    rows = run(
        args.quick,
        samples=args.samples,
        lease_ttl=args.lease_ttl,
        step=args.step,
        plain_wait=args.plain_wait,
    )
    report(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
