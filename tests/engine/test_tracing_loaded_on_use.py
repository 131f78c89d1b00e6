"""opentelemetry is loaded only by a process that may trace: one that imported it (to set
a tracer provider or start a span) or names a provider in the environment. Producers,
the command line and workers that do not trace import agentq, and run its hooks, without
it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

APPLICATION_TRACES = textwrap.dedent(
    """
    import sys
    from agentq import AgentTask, init_app
    from agentq.engine import tracing

    with tracing.node_span("t1", {}, 0, "start", 1, 7):
        tracing.outcome("t1", "committed")
        with tracing.tool_span("t1", 0, "refund", 7) as note:
            note("step0.call1", "called")
    assert tracing.sending_headers() == {}
    assert not [m for m in sys.modules if m.startswith("opentelemetry")], "imported"

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    trace.set_tracer_provider(provider)
    with tracing.node_span("t1", {}, 1, "model", 1, 7):
        tracing.outcome("t1", "committed")
    (span,) = exported.get_finished_spans()
    assert span.name == "agentq.node model", span.name
    assert span.attributes["agentq.outcome"] == "committed", dict(span.attributes)
    print("loaded on use")
    """
)

ENVIRONMENT_NAMES_A_PROVIDER = textwrap.dedent(
    """
    from agentq.engine import tracing

    with tracing.node_span("t1", {}, 0, "start", 1, 7):
        from opentelemetry import trace

        assert trace.get_current_span().is_recording()
    print("loaded on use")
    """
)


def _run(script: str, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
            "PYTHONPATH": str(ROOT),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_opentelemetry_is_imported_once_the_application_imports_it() -> None:
    assert _run(APPLICATION_TRACES) == "loaded on use"


def test_a_tracer_provider_named_in_the_environment_records_spans() -> None:
    script = ENVIRONMENT_NAMES_A_PROVIDER
    assert _run(script, OTEL_PYTHON_TRACER_PROVIDER="sdk_tracer_provider") == "loaded on use"
