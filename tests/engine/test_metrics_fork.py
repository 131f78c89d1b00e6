"""A prefork worker's parent forks children (a replacement for one that exited) while its
threads use the metrics: the sweeper loading them or counting a recovery. The child must
still record: it inherits no lock held."""

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
        metrics.recovered(1)
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

COUNTING = textwrap.dedent(
    """
    import os
    import threading
    import time

    from agentq.engine import metrics, prometheus

    inside, forking = threading.Event(), threading.Event()
    real = prometheus.RECOVERIES

    class Counting:
        # Holds the counter's own lock, as prometheus_client does while it adds, until
        # a fork has begun.
        def inc(self, amount=1):
            with real._value._lock:
                inside.set()
                forking.wait()

    prometheus.RECOVERIES = Counting()
    # Registered last, so run first of the fork's handlers.
    os.register_at_fork(before=forking.set)
    using = threading.Thread(target=metrics.recovered, args=(1,))
    using.start()
    inside.wait()
    prometheus.RECOVERIES = real
    """
)


def _child_of(script: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", script + CHILD_RECORDS],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_child_forked_while_the_metrics_load_records_its_steps() -> None:
    assert _child_of(LOADING) == "child recorded"


def test_a_child_forked_while_a_counter_is_counted_records_its_steps() -> None:
    assert _child_of(COUNTING) == "child recorded"
