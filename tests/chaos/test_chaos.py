"""Chaos: threads keep running to the same result while workers are SIGKILLed, deployed
(SIGTERM), frozen past their lease (SIGSTOP) and the store is SIGKILLed and restarted,
on prefork workers, on ``-P threads -c 20`` workers and on ``-P gevent -c 100`` workers,
where one SIGKILL takes down every thread a process drives (up to a hundred under gevent),
once more on gevent with ``async def`` nodes and tools, and on ``-P threads`` with a
SQLite store, whose outage is another process holding its write lock.

The machinery lives in :mod:`tests.support.chaos`, shared with ``python -m bench.chaos``.

A SIGSTOP landing inside a ``reconcile`` tool between the lease check before the call and
the call itself hits the known limit: the email goes out twice, once from the frozen worker
under the lease it held when frozen and once under the newer token of the worker that took
the thread over. The run counts those as ``frozen_worker_calls`` and fails on any other
second email;
``test_zombie_effect.py`` reproduces the limit deterministically. Store faults it can only
hit rarely are in ``test_store_faults.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.support.chaos import ChaosCluster, ChaosConfig, chaos_cluster, run_and_verify

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


@pytest.fixture(params=["prefork", "threads", "threads-sqlite", "gevent", "gevent-async"])
def cluster(
    request: pytest.FixtureRequest,
    chaos_size: tuple[int, int],
    redis_broker: str,
    tmp_path: Path,
) -> Iterator[ChaosCluster]:
    threads, steps = chaos_size
    config = ChaosConfig(threads=threads, steps=steps, broker=redis_broker)
    if request.param.startswith("threads"):
        # One process drives 20 threads, so a SIGKILL takes up to 20 down at once. Four
        # times the threads over half the arrival time keep ~40 in flight (threads * steps
        # seconds over arrival_seconds): both workers' pools full when the chaos strikes.
        config = replace(
            config,
            pool="threads",
            workers=2,
            concurrency=20,
            threads=4 * threads,
            arrival_seconds=config.arrival_seconds / 2,
            store="sqlite" if request.param.endswith("-sqlite") else "redis",
        )
    elif request.param.startswith("gevent"):
        # Ten times the threads over half the arrival time: ~100 in flight, so each
        # SIGKILL takes dozens of greenlets' threads down at once.
        config = replace(
            config,
            pool="gevent",
            workers=2,
            concurrency=100,
            async_nodes=request.param.endswith("-async"),
            threads=10 * threads,
            arrival_seconds=config.arrival_seconds / 2,
        )
    with chaos_cluster(config, tmp_path) as cluster:
        yield cluster


@pytest.mark.timeout(420)
def test_threads_survive_kills_deploys_zombies_and_store_restarts(
    cluster: ChaosCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    report = run_and_verify(cluster)  # its timeline is shown if the test fails
    with capsys.disabled():
        print("\n" + "\n".join(report.lines()))
    figures = report.figures
    assert not report.problems, "\n".join(report.problems)
    assert figures["lost"] == 0
    assert figures["duplicate_effects"] == 0
    assert figures["undecodable_checkpoints"] == 0
    # The chaos really happened: each kind at least once, and kills hit running threads.
    for kind in ("kills", "deploys", "zombies", "store_restarts"):
        assert int(figures[kind]) >= 1, f"no {kind}: the threads finished too soon"
    assert int(figures["threads_hit_by_sigkill"]) >= 1
