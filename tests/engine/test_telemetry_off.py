"""Without the ``otel`` and ``prometheus`` extras every hook is a no-op and neither
library is imported: a Python that cannot import them runs the hooks as usual."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["opentelemetry"] = None  # as if not installed: importing it fails
    sys.modules["prometheus_client"] = None
    import os
    # As if it named a provider: agentq tries the import, which fails.
    os.environ["OTEL_PYTHON_TRACER_PROVIDER"] = "sdk_tracer_provider"
    from agentq.engine import metrics, tracing
    from agentq.errors import ConfigError

    assert tracing.sending_headers() == {}
    with tracing.node_span("t1", {}, 0, "start", 1, 7):
        tracing.outcome("t1", "committed")
        tracing.raised("t1", ValueError())
        with tracing.tool_span("t1", 0, "refund", 7) as note:
            note("step0.call1", "called")
    metrics.committed(0.1)
    metrics.retried(ValueError())
    try:
        metrics.registry(None, counters=True)
    except ConfigError as exc:
        assert "agentq[prometheus]" in str(exc)
    else:
        raise AssertionError("metrics served without prometheus_client")
    print("off")
    """
)


def test_hooks_run_without_opentelemetry_or_prometheus_client() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "off"
