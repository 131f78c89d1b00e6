"""A prefork worker's parent may fork a child while one of its threads (the sweeper,
recording its first recovery) is loading the metrics: the child must still record."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
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

    loading = threading.Thread(target=first_use)
    loading.start()
    held.wait()
    pid = os.fork()
    if pid == 0:
        metrics.committed(0.001)
        os._exit(0)
    loading.join()
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


def test_a_child_forked_while_the_metrics_load_records_its_steps() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "child recorded"
