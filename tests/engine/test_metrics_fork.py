"""A prefork worker's parent forks children (a replacement for one that exited) while its
threads use the metrics: the sweeper loading them, its ``/metrics`` thread reading them.
The child must still record: it inherits no lock held. And the fork waits for agentq's
own counters only, never for the application's collectors a scrape also runs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD_RECORDS = textwrap.dedent(
    """
    pid = os.fork()
    if pid == 0:
        metrics.committed(0.001)
        os._exit(0)
    using.join()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            print("child recorded" if status == 0 else f"child failed {status}")
            break
        threading.Event().wait(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        print("child hung")
    """
)

LOADING = textwrap.dedent(
    """
    import os
    import threading
    import time

    from agentq.engine import metrics

    held = threading.Event()

    def first_use():
        # As metrics' first use holds it while prometheus_client is imported.
        with metrics._lock:
            held.set()
            threading.Event().wait(0.3)

    using = threading.Thread(target=first_use)
    using.start()
    held.wait()
    """
)

READING = textwrap.dedent(
    """
    import os
    import threading
    import time

    from prometheus_client import REGISTRY, generate_latest

    from agentq.engine import metrics, prometheus

    metrics.committed(0.001)
    inside, forking = threading.Event(), threading.Event()
    real = prometheus.STEPS._value

    class Reading:
        # Holds the counter's own lock, as prometheus_client does while it reads the
        # value, until a fork has begun.
        def get(self):
            with real._lock:
                inside.set()
                forking.wait()
                return real._value

        def __getattr__(self, name):
            return getattr(real, name)

    prometheus.STEPS._value = Reading()
    # Registered last, so run first of the fork's handlers.
    os.register_at_fork(before=forking.set)
    # The application's exposition of the default registry: agentq's /metrics reads the
    # counters through it too.
    using = threading.Thread(target=generate_latest, args=(REGISTRY,))
    using.start()
    inside.wait()
    prometheus.STEPS._value = real
    """
)


def _run(script: str, tmp_path: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", script, f"sqlite:///{tmp_path / 'agentq.db'}"],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_child_forked_while_the_metrics_load_records_its_steps(tmp_path: Path) -> None:
    assert _run(LOADING + CHILD_RECORDS, tmp_path) == "child recorded"


def test_a_child_forked_while_a_scrape_reads_the_counters_records_its_steps(
    tmp_path: Path,
) -> None:
    assert _run(READING + CHILD_RECORDS, tmp_path) == "child recorded"


UPDATING = textwrap.dedent(
    """
    import os
    import threading
    import time

    from agentq.engine import metrics, prometheus

    metrics.committed(0.001)
    inside, forking = threading.Event(), threading.Event()
    real = prometheus.STEPS._value

    class Updating:
        # Holds the counter's own lock, as prometheus_client does while it adds to the
        # value (the sweeper counting a recovery, a step committed), until a fork began.
        def inc(self, amount):
            with real._lock:
                inside.set()
                forking.wait()
                real._value += amount

        def __getattr__(self, name):
            return getattr(real, name)

    prometheus.STEPS._value = Updating()
    # Registered last, so run first of the fork's handlers.
    os.register_at_fork(before=forking.set)
    using = threading.Thread(target=metrics.committed, args=(0.001,))
    using.start()
    inside.wait()
    prometheus.STEPS._value = real
    """
)


def test_a_child_forked_while_a_counter_is_counted_records_its_steps(tmp_path: Path) -> None:
    assert _run(UPDATING + CHILD_RECORDS, tmp_path) == "child recorded"


APPLICATION_COLLECTOR = textwrap.dedent(
    """
    import os
    import sys
    import threading

    from prometheus_client import REGISTRY

    from agentq.engine import metrics
    from agentq.store import open_store

    store = open_store(sys.argv[1])
    collecting, release = threading.Event(), threading.Event()

    class Slow:
        # An application's collector that takes its time (a query, a remote call). Its
        # describe() keeps the default registry from collecting it when registered.
        def describe(self):
            return []

        def collect(self):
            collecting.set()
            release.wait()
            return []

    REGISTRY.register(Slow())
    metrics.committed(0.001)
    served = metrics.registry(store, counters=True)
    scraped = []
    scrape = threading.Thread(
        target=lambda: scraped.append(metrics.exposition(served)[0].decode())
    )
    scrape.start()
    collecting.wait()

    committing = threading.Thread(target=metrics.committed, args=(0.001,))
    committing.start()
    committing.join(20)
    print("commit waited" if committing.is_alive() else "committed")

    def fork():
        if os.fork() == 0:
            os._exit(0)

    forking = threading.Thread(target=fork)
    forking.start()
    forking.join(20)
    print("fork waited" if forking.is_alive() else "forked")

    release.set()
    for thread in (scrape, committing, forking):
        thread.join()
    os.wait()
    # agentq's counters, once, read after the application's collector: with both steps.
    print(scraped[0].splitlines().count("agentq_steps_committed_total 2.0"))
    """
)


def test_a_scrape_holds_no_commit_nor_fork_while_application_collectors_run(
    tmp_path: Path,
) -> None:
    assert _run(APPLICATION_COLLECTOR, tmp_path).splitlines() == ["committed", "forked", "1"]
