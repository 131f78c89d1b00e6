"""The crash tests' worker app, exporting its spans as JSON lines to ``AGENTQ_TEST_SPANS``
and serving metrics on ``AGENTQ_TEST_METRICS_PORT``: what an application does to trace
and measure its workers, with a file where a collector would be."""

from __future__ import annotations

import os
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from tests.support.agents import make_app


class JsonLinesExporter(SpanExporter):
    """One span a line, appended as it ends (prefork children share the file)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(span.to_json(indent=None) + "\n" for span in spans)
        with open(self.path, "a") as out:
            out.write(lines)
        return SpanExportResult.SUCCESS


provider = TracerProvider(
    resource=Resource.create({"test.worker": os.environ["AGENTQ_TEST_WORKER_LABEL"]})
)
provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(os.environ["AGENTQ_TEST_SPANS"])))
trace.set_tracer_provider(provider)

port = os.environ.get("AGENTQ_TEST_METRICS_PORT")
app = make_app(
    broker=os.environ["AGENTQ_TEST_BROKER"],
    store=os.environ["AGENTQ_TEST_STORE"],
    prefix=os.environ["AGENTQ_TEST_PREFIX"],
    queue=os.environ["AGENTQ_TEST_QUEUE"],
    ledger_url=os.environ["AGENTQ_TEST_LEDGER"],
    lease_ttl=float(os.environ["AGENTQ_TEST_LEASE_TTL"]),
    sweep_interval=0.2,
    start_grace=3.0,
    metrics_port=int(port) if port else None,
)
app.conf.worker_prefetch_multiplier = 1
