"""Node and tool spans of one thread driven twice at once in one process: a drive that
lost its lease mid-node (a store outage longer than the lease) still runs its node while
the drive that took the thread over, in another pool thread, runs its own. Each drive's
outcome and tool calls belong to its own node span."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json
    import threading

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agentq.engine import tracing

    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    trace.set_tracer_provider(provider)

    zombie_in_node, heir_in_node, zombie_ended = (threading.Event() for _ in range(3))

    def zombie():
        try:
            with tracing.node_span("t1", {}, 3, "model", 1, 7):
                zombie_in_node.set()
                heir_in_node.wait()
                with tracing.tool_span("t1", 3, "lookup", 7) as note:
                    note("zombie-call", "called")
                tracing.outcome("t1", "retrying")  # its settle, which the store refuses
                raise RuntimeError("fenced")
        except RuntimeError:
            pass
        finally:
            zombie_ended.set()

    def heir():
        zombie_in_node.wait()
        with tracing.node_span("t1", {}, 3, "model", 1, 8):
            heir_in_node.set()
            zombie_ended.wait()
            with tracing.tool_span("t1", 3, "lookup", 8) as note:
                note("heir-call", "called")
            tracing.outcome("t1", "committed")

    threads = [threading.Thread(target=zombie), threading.Thread(target=heir)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps([json.loads(span.to_json()) for span in exported.get_finished_spans()]))
    """
)


def test_a_zombie_drive_and_its_heir_in_one_process_keep_their_own_spans() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    spans = json.loads(done.stdout)
    token = "agentq.fencing_token"
    nodes = {s["attributes"][token]: s for s in spans if s["name"] == "agentq.node model"}
    tools = {s["attributes"][token]: s for s in spans if s["name"] == "agentq.tool lookup"}
    assert set(nodes) == set(tools) == {7, 8}
    assert nodes[7]["attributes"]["agentq.outcome"] == "retrying"
    assert nodes[8]["attributes"]["agentq.outcome"] == "committed"
    for fence in (7, 8):
        assert tools[fence]["parent_id"] == nodes[fence]["context"]["span_id"], fence
