"""prometheus_client is loaded, and agentq's counters registered in its default registry,
only by a process that records or serves metrics: producers and the command line import
agentq without either."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import sys
    import agentq
    from agentq.engine import metrics

    assert "prometheus_client" not in sys.modules, "imported by import agentq"
    metrics.lease_lost()
    from prometheus_client import REGISTRY, generate_latest

    lines = generate_latest(REGISTRY).decode().splitlines()
    assert "agentq_leases_lost_total 1.0" in lines, lines
    assert "agentq_steps_committed_total 0.0" in lines, lines
    print("loaded on use")
    """
)


def test_prometheus_client_is_imported_when_a_metric_is_first_recorded() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "loaded on use"
