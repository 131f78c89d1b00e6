"""Traces and metrics of real ``celery worker`` subprocesses that hand a thread over or
die under it: one trace per thread, and counters and gauges that match what happened."""

from __future__ import annotations

import json
import signal
import socket
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from agentq import Status, errors
from agentq.ui.app import create_app
from tests.support.agents import Ledger, make_app
from tests.support.redis_server import RedisServer, wait_until
from tests.support.workers import WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

LEASE_TTL = 2.0

CALLER_SPANS = InMemorySpanExporter()
"""The spans of this process: the caller that starts threads."""


@pytest.fixture(scope="module", autouse=True)
def caller_tracing() -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(CALLER_SPANS))
    trace.set_tracer_provider(provider)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Fleet:
    """A store, a Redis broker, and traced worker subprocesses, each labelled in its
    spans' resource and serving metrics on a port of its own."""

    def __init__(self, broker: str, server: RedisServer, tmp: Path) -> None:
        prefix = f"ob{uuid.uuid4().hex[:8]}:"
        self.spans = tmp / "spans.jsonl"
        self.env = {
            "AGENTQ_TEST_BROKER": broker,
            "AGENTQ_TEST_STORE": server.url,
            "AGENTQ_TEST_PREFIX": prefix,
            "AGENTQ_TEST_QUEUE": f"agentq-obs-{prefix}",
            "AGENTQ_TEST_LEDGER": server.url,
            "AGENTQ_TEST_LEASE_TTL": str(LEASE_TTL),
            "AGENTQ_TEST_SPANS": str(self.spans),
        }
        self.app = make_app(
            broker=broker,
            store=server.url,
            prefix=prefix,
            queue=self.env["AGENTQ_TEST_QUEUE"],
            ledger_url=server.url,
            lease_ttl=LEASE_TTL,
        )
        self.store = self.app._agentq_runtime.store
        self.ledger = Ledger(server.url, prefix.rstrip(":"))
        self.tmp = tmp
        self.workers: list[WorkerProcess] = []

    def worker(
        self, label: str, *, multiprocess: bool = True, **extra_env: str
    ) -> tuple[WorkerProcess, int]:
        port = free_port()
        env = {
            **self.env,
            "AGENTQ_TEST_WORKER_LABEL": label,
            "AGENTQ_TEST_METRICS_PORT": str(port),
            **extra_env,
        }
        if multiprocess:
            # A prefork worker's tasks count in its child: the main process serves the
            # counters of all its processes from this directory.
            counters = self.tmp / f"metrics-{label}"
            counters.mkdir()
            env["PROMETHEUS_MULTIPROC_DIR"] = str(counters)
        worker = WorkerProcess(
            self.app, env, self.tmp, app_module="tests.support.traced_worker_app"
        ).start()
        self.workers.append(worker)
        return worker, port

    def spans_named(self, prefix: str) -> list[dict[str, Any]]:
        if not self.spans.exists():
            return []
        spans = [json.loads(line) for line in self.spans.read_text().splitlines()]
        return [s for s in spans if s["name"].startswith(prefix)]

    def node_spans(self) -> list[dict[str, Any]]:
        return self.spans_named("agentq.node")

    def all_node_spans(self) -> list[dict[str, Any]]:
        """The node spans once the last one is exported: a span ends after its commit,
        which the caller may see first."""

        def finished() -> list[dict[str, Any]]:
            spans = self.node_spans()
            done = any(s["attributes"].get("agentq.outcome") == "done" for s in spans)
            return spans if done else []

        spans: list[dict[str, Any]] = wait_until(finished, timeout=10, what="the last span")
        return spans

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.app.close()


@pytest.fixture
def fleet(redis_broker: str, redis_server: RedisServer, tmp_path: Path) -> Iterator[Fleet]:
    env = Fleet(redis_broker, redis_server, tmp_path)
    try:
        yield env
    finally:
        env.close()


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return parsed(reply.read().decode())


def parsed(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_a_thread_handed_over_between_workers_is_one_trace(fleet: Fleet) -> None:
    agent = fleet.app.tasks["tests.counting_agent"]
    first, _ = fleet.worker("first")
    with trace.get_tracer("tests").start_as_current_span("request") as request:
        agent.delay("t1", n=8, slow=0.3)
    wait_until(lambda: agent.thread("t1").step >= 2, timeout=30, what="two steps")
    first.terminate()
    first.wait_exit(timeout=10)
    assert agent.thread("t1").status == Status.QUEUED
    fleet.worker("second")
    assert agent.wait("t1", timeout=60) == 8

    spans = fleet.all_node_spans()
    context = request.get_span_context()
    assert {s["context"]["trace_id"] for s in spans} == {f"0x{context.trace_id:032x}"}
    assert {s["parent_id"] for s in spans} == {f"0x{context.span_id:016x}"}
    workers = {s["resource"]["attributes"]["test.worker"] for s in spans}
    assert workers == {"first", "second"}
    # Every step ran once to its commit: start, 8 counts, finish.
    ended = sorted(s["attributes"]["agentq.step"] for s in spans)
    assert ended == list(range(10)), ended
    last = max(spans, key=lambda s: s["attributes"]["agentq.step"])
    assert last["attributes"]["agentq.outcome"] == "done"
    assert {s["attributes"]["agentq.thread_id"] for s in spans} == {"t1"}


def test_a_crash_is_one_trace_and_counted(fleet: Fleet) -> None:
    agent = fleet.app.tasks["tests.support_agent"]
    fleet.ledger.arm_crash("t1", "model")
    first, _ = fleet.worker("first")
    agent.delay("t1", question="refund please", refunds=1)  # no caller span: none to join
    wait_until(lambda: fleet.ledger.reached("t1", "model"), timeout=30, what="the model call")
    fence = agent.thread("t1").fence
    first.kill()
    _, port = fleet.worker("second")
    assert agent.wait("t1", timeout=60) == "Refunded 10 EUR."

    spans = fleet.all_node_spans()
    assert len({s["context"]["trace_id"] for s in spans}) == 1
    assert {s["resource"]["attributes"]["test.worker"] for s in spans} == {
        "first",
        "second",
    }
    retaken = [s for s in spans if s["attributes"]["agentq.fencing_token"] > fence]
    assert retaken and {s["resource"]["attributes"]["test.worker"] for s in retaken} == {"second"}
    (tool,) = fleet.spans_named("agentq.tool")
    (node,) = [s for s in spans if s["attributes"]["agentq.node"] == "tools"]
    assert tool["parent_id"] == node["context"]["span_id"]
    assert tool["attributes"]["agentq.effect_key"] == "call-refund-1"
    assert tool["attributes"]["agentq.outcome"] == "called"

    # The second worker re-sent the thread, found it lost and committed model, tools, model.
    metrics = scrape(port)
    assert metrics[("agentq_takeovers_total", ())] == 1
    assert metrics[("agentq_recoveries_total", ())] >= 1
    assert {s["attributes"]["agentq.outcome"] for s in retaken} <= {"committed", "done"}
    assert metrics[("agentq_steps_committed_total", ())] == len(retaken)
    assert metrics[("agentq_commit_seconds_count", ())] == len(retaken)
    assert metrics[("agentq_threads", (("status", "done"),))] == 1
    assert metrics[("agentq_threads", (("status", "running"),))] == 0

    inspector = TestClient(create_app(fleet.store), base_url="http://127.0.0.1")
    page = inspector.get("/metrics")
    assert page.status_code == 200
    shown = parsed(page.text)
    assert shown[("agentq_threads", (("status", "done"),))] == 1
    assert shown[("agentq_needs_attention", ())] == 0
    assert shown[("agentq_due_lag_seconds", ())] == 0
    assert ("agentq_takeovers_total", ()) not in shown  # no worker counts in the inspector


def test_retries_are_counted_by_cause(fleet: Fleet) -> None:
    agent = fleet.app.tasks["tests.support_agent"]
    _, port = fleet.worker("only")
    agent.delay("t1", question="refund please", refunds=0, rate_limits=2, retry_after=1)
    assert agent.wait("t1", timeout=60) == "Refunded 0 EUR."
    spans = fleet.all_node_spans()
    metrics = scrape(port)
    assert metrics[("agentq_retries_total", (("cause", "RateLimitError"),))] == 2
    assert metrics[("agentq_takeovers_total", ())] == 0
    retried = [s for s in spans if s["attributes"]["agentq.outcome"] == "retrying"]
    assert [s["attributes"]["agentq.attempt"] for s in retried] == [1, 2]


def test_a_lease_lost_to_a_takeover_is_counted_by_its_loser(fleet: Fleet) -> None:
    agent = fleet.app.tasks["tests.counting_agent"]
    zombie, zombie_port = fleet.worker("zombie")
    agent.delay("t1", n=12, slow=0.3)
    wait_until(lambda: agent.thread("t1").step >= 1, timeout=30, what="a step")
    zombie.signal_group(signal.SIGSTOP)
    fence = agent.thread("t1").fence
    _, port = fleet.worker("heir")
    wait_until(lambda: agent.thread("t1").fence > fence, timeout=30, what="takeover")
    zombie.signal_group(signal.SIGCONT)
    assert agent.wait("t1", timeout=60) == 12
    lost = ("agentq_leases_lost_total", ())
    wait_until(lambda: scrape(zombie_port)[lost] == 1, timeout=30, what="the loss counted")
    assert scrape(port)[lost] == 0
    assert scrape(port)[("agentq_takeovers_total", ())] == 1


def test_async_tools_are_children_of_their_nodes(fleet: Fleet) -> None:
    agent = fleet.app.tasks["tests.napping_agent"]
    fleet.worker("only")
    agent.delay("t1", seconds=0.05)
    agent.wait("t1", timeout=60)
    nodes = {s["attributes"]["agentq.step"]: s for s in fleet.all_node_spans()}
    tools = sorted(fleet.spans_named("agentq.tool"), key=lambda s: s["attributes"]["agentq.step"])
    assert [t["attributes"]["agentq.effect_key"] for t in tools] == ["first", "second"]
    for tool in tools:
        node = nodes[tool["attributes"]["agentq.step"]]
        assert tool["parent_id"] == node["context"]["span_id"]
        assert tool["context"]["trace_id"] == node["context"]["trace_id"]
        assert tool["attributes"]["agentq.outcome"] == "called"


def test_spans_a_tool_starts_are_children_of_its_tool_span(fleet: Fleet) -> None:
    agent = fleet.app.tasks["tests.traced_tool_agent"]
    fleet.worker("only")
    agent.delay("t1")
    assert agent.wait("t1", timeout=60) == "o1"
    fleet.all_node_spans()
    tools = {s["attributes"]["agentq.effect_key"]: s for s in fleet.spans_named("agentq.tool")}
    inside = {s["name"]: s for s in fleet.spans_named("tests.inside")}
    for key, name in (("lookup", "tests.inside lookup"), ("fetch", "tests.inside fetch")):
        assert inside[name]["parent_id"] == tools[key]["context"]["span_id"], name
        assert inside[name]["context"]["trace_id"] == tools[key]["context"]["trace_id"]


def test_a_thread_started_outside_a_span_is_sampled_as_the_workers_sampler_says(
    fleet: Fleet,
) -> None:
    agent = fleet.app.tasks["tests.counting_agent"]
    # A root sampler that keeps no trace: only a sampled caller's threads are traced.
    fleet.worker(
        "only", OTEL_TRACES_SAMPLER="parentbased_traceidratio", OTEL_TRACES_SAMPLER_ARG="0"
    )
    agent.delay("untraced", n=2)
    assert agent.wait("untraced", timeout=60) == 2
    # The worker runs one task at a time: the first thread's spans ended before this one.
    with trace.get_tracer("tests").start_as_current_span("request"):
        agent.delay("traced", n=2)
    assert agent.wait("traced", timeout=60) == 2
    spans = fleet.all_node_spans()
    assert {s["attributes"]["agentq.thread_id"] for s in spans} == {"traced"}


def test_a_prefork_worker_without_a_multiprocess_directory_warns_that_it_counts_unseen(
    fleet: Fleet,
) -> None:
    agent = fleet.app.tasks["tests.counting_agent"]
    worker, port = fleet.worker("only", multiprocess=False)
    agent.delay("t1", n=2)
    assert agent.wait("t1", timeout=60) == 2
    # Committed in the pool's child: the main process, which serves them, counted none.
    assert scrape(port)[("agentq_steps_committed_total", ())] == 0
    wait_until(
        lambda: "set PROMETHEUS_MULTIPROC_DIR" in worker.log.read_text(),
        timeout=10,
        what="the warning",
    )


def test_a_node_or_tool_that_raised_ends_its_span_in_error(fleet: Fleet) -> None:
    flaky = fleet.app.tasks["tests.flaky_tool_agent"]
    broken = fleet.app.tasks["tests.broken_agent"]
    fleet.worker("only")
    flaky.delay("retried", mode="rate_limit")
    assert flaky.wait("retried", timeout=60) == "charged 5"
    broken.delay("failed", mode="bug")
    wait_until(lambda: broken.thread("failed").status == Status.FAILED, timeout=60, what="failed")

    def ended() -> list[dict[str, Any]]:
        spans = fleet.node_spans()
        return spans if any(s["attributes"]["agentq.node"] == "work" for s in spans) else []

    nodes = wait_until(ended, timeout=10, what="the failed node's span")
    errors = {
        (s["attributes"]["agentq.thread_id"], s["attributes"]["agentq.outcome"]): s
        for s in nodes
        if s["status"]["status_code"] == "ERROR"
    }
    assert set(errors) == {("retried", "retrying"), ("failed", "failed")}
    assert errors["retried", "retrying"]["events"][0]["attributes"]["exception.type"].endswith(
        "RateLimitError"
    )
    assert errors["failed", "failed"]["events"][0]["attributes"]["exception.type"] == "KeyError"
    tools = fleet.spans_named("agentq.tool")
    assert [(s["attributes"]["agentq.outcome"], s["status"]["status_code"]) for s in tools] == [
        ("error", "ERROR"),
        ("called", "UNSET"),
    ]


def test_a_tool_call_that_raised_names_its_effect_key(fleet: Fleet) -> None:
    flaky = fleet.app.tasks["tests.flaky_tool_agent"]
    fleet.worker("only")
    flaky.delay("t1", mode="rate_limit")
    assert flaky.wait("t1", timeout=60) == "charged 5"
    fleet.all_node_spans()
    tools = fleet.spans_named("agentq.tool")
    assert [
        (s["attributes"]["agentq.outcome"], s["attributes"]["agentq.effect_key"]) for s in tools
    ] == [
        ("error", "charge-1"),
        ("called", "charge-1"),
    ]


def test_a_retry_its_worker_was_fenced_from_is_not_its_spans_outcome(fleet: Fleet) -> None:
    agent = fleet.app.tasks["tests.stalling_agent"]
    ledger = fleet.ledger
    zombie, _ = fleet.worker("zombie")
    agent.delay("t1")
    wait_until(
        lambda: ledger.client.get(ledger.key("stalls", "t1")) == "1", timeout=30, what="a stall"
    )
    zombie.signal_group(signal.SIGSTOP)
    fleet.worker("heir")
    assert agent.wait("t1", timeout=60) == "finished"
    zombie.signal_group(signal.SIGCONT)
    ledger.client.rpush(ledger.key("go", "t1"), "go")  # its node fails now: a retry, refused

    def stalled() -> list[dict[str, Any]]:
        return [
            s
            for s in fleet.node_spans()
            if s["attributes"]["agentq.node"] == "stall"
            and s["resource"]["attributes"]["test.worker"] == "zombie"
        ]

    (span,) = wait_until(stalled, timeout=30, what="the zombie's span")
    assert span["attributes"]["agentq.outcome"] == "error"
    raised = span["events"][-1]["attributes"]["exception.type"].rpartition(".")[2]
    assert issubclass(getattr(errors, raised), errors.FencingError), raised
    assert agent.thread("t1").status == Status.DONE
