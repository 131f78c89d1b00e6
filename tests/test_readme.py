"""The README's snippets run as written, given the names they leave to the reader."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Annotated, Any

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt
from typing_extensions import TypedDict

import agentq
from agentq import AgentTask, Done, Run
from agentq.celery.runtime import runtime_of
from agentq.errors import ThreadStopped
from agentq.langgraph import tool_call
from agentq.ops.doctor import celery_findings
from agentq.settings import Settings
from tests.support.redis_server import RedisServer, wait_until

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def python_block(containing: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    (block,) = [block for block in blocks if containing in block]
    return block


def app_of_its_own(broker: str, name: str) -> tuple[Celery, str]:
    """An app on the test's broker, with a queue and a store prefix of its own."""
    prefix = f"readme{uuid.uuid4().hex[:8]}:"
    app = Celery(name, broker=broker, set_as_current=False)
    app.conf.update(task_default_queue=f"agentq-test-{prefix}", worker_hijack_root_logger=False)
    return app, prefix


def on_servers(snippet: str, server: RedisServer, prefix: str) -> str:
    """``snippet`` with the README's store at localhost replaced by the test's."""
    return snippet.replace(
        'store="redis://localhost:6379/1"', f"store={server.url!r}, prefix={prefix!r}"
    )


class ChatClient:
    """A model client as the README asks for one: its reply as plain data, what an
    OpenAI reply's ``.model_dump()`` holds (a tool's result is recorded)."""

    @staticmethod
    def chat(messages: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "choices": [{"message": {"role": "assistant", "content": "refunded"}}],
            "usage": {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42},
        }


def limited_app(broker: str, server: RedisServer, snippet: str) -> tuple[Celery, dict[str, Any]]:
    """An app set up by the README's rate-limit snippet, on the test's servers."""
    app, prefix = app_of_its_own(broker, "readme-limits")
    namespace: dict[str, Any] = {
        "agentq": agentq,
        "app": app,
        "llm": ChatClient,
        "estimate_tokens": lambda messages: 100,
    }
    exec(compile(on_servers(snippet, server, prefix), "README.md", "exec"), namespace)
    return app, namespace


def run_model(app: Celery, model: Any) -> Any:
    """Run ``model`` as the node after a start node, on a worker; the thread's result."""

    class LimitedAgent(AgentTask):
        name = "tests.readme_limits"

        def start(self, run: Run) -> str:
            run.state.update(messages=[{"role": "user", "content": "refund?"}], tenant="acme")
            return "model"

        def model(self, run: Run) -> Done:
            model(self, run)
            return Done("answered")

    agent: LimitedAgent = app.register_task(LimitedAgent())
    try:
        with start_worker(app, pool="solo", perform_ping_check=False):
            agent.delay("readme-limits")
            return agent.wait("readme-limits", timeout=30)
    finally:
        app.close()


def test_the_rate_limit_snippet_runs_with_a_chat_client(
    redis_broker: str, redis_server: RedisServer
) -> None:
    app, namespace = limited_app(redis_broker, redis_server, python_block("actual_cost="))
    assert run_model(app, namespace["model"]) == "answered"


def test_the_fix_an_actual_cost_error_suggests_reads_a_recorded_result(
    redis_broker: str, redis_server: RedisServer
) -> None:
    app, _ = limited_app(redis_broker, redis_server, python_block("actual_cost="))

    def model(self: AgentTask, run: Run) -> None:
        run.tool(ChatClient.chat, [], limit="openai", cost=100, actual_cost=lambda r: r["tokens"])

    with pytest.raises(ThreadStopped, match="actual_cost raised") as stopped:
        run_model(app, model)
    hint = re.search(r"e\.g\. (lambda r: .*?)\)$", str(stopped.value))
    assert hint is not None, stopped.value
    assert eval(hint.group(1))(ChatClient.chat([])) == 42


def test_the_first_agent_s_app_passes_doctor() -> None:
    # `agentq doctor -A proj` on the app as the README writes it: nothing to fix.
    module = python_block('support_agent.wait("thread-42"')
    module = module[: module.index("support_agent.delay(")]  # the app, without its calls
    namespace: dict[str, Any] = {"RateLimitError": type("RateLimitError", (Exception,), {})}
    exec(compile(module, "README.md", "exec"), namespace)
    app = namespace["app"]
    try:
        assert celery_findings(app, runtime_of(app).settings) == []
    finally:
        app.close()


class ScriptedModel:
    """``llm`` of the first agent: asks for one tool call, then answers with
    ``tool_calls`` ``None``, as a chat client's reply holds when it makes none."""

    @staticmethod
    def chat(messages: list[dict[str, Any]]) -> dict[str, Any]:
        if not any(message["role"] == "tool" for message in messages):
            call = {"id": "call_1", "name": "lookup", "args": {"order_id": "1042"}}
            return {"role": "assistant", "content": None, "tool_calls": [call]}
        return {
            "role": "assistant",
            "content": f"refunded: {messages[-1]['content']}",
            "tool_calls": None,
        }


def test_the_first_agent_runs_its_tool_and_answers(
    redis_broker: str, redis_server: RedisServer
) -> None:
    block = python_block('support_agent.wait("thread-42"')
    module, calls = block.split("support_agent.delay(")
    prefix = f"readme{uuid.uuid4().hex[:8]}:"
    module = on_servers(module, redis_server, prefix).replace(
        "redis://localhost:6379/0", redis_broker
    )
    namespace: dict[str, Any] = {
        "RateLimitError": type("RateLimitError", (Exception,), {}),
        "llm": ScriptedModel,
        "TOOLS": {"lookup": lambda order_id: f"order {order_id} refunded"},
    }
    exec(compile(module, "README.md", "exec"), namespace)
    app = namespace["app"]
    app.conf.update(task_default_queue=f"agentq-test-{prefix}", worker_hijack_root_logger=False)
    try:
        with start_worker(app, pool="solo", perform_ping_check=False):
            exec(compile("support_agent.delay(" + calls, "README.md", "exec"), namespace)
        meta = namespace["support_agent"].thread("thread-42")
        assert meta.result == "refunded: order 1042 refunded"
    finally:
        app.close()


def test_the_function_agent_runs_its_nodes(redis_broker: str, redis_server: RedisServer) -> None:
    app, prefix = app_of_its_own(redis_broker, "readme-function")
    agentq.init_app(app, store=redis_server.url, prefix=prefix)
    namespace: dict[str, Any] = {
        "agentq": agentq,
        "app": app,
        "RateLimitError": type("RateLimitError", (Exception,), {}),
    }
    # The model node's body is the reader's: it answers with the question.
    snippet = python_block("agentq.agent(app").replace(
        "    ...\n", '    return agentq.Done(run.state["messages"][0]["content"])\n'
    )
    exec(compile(snippet, "README.md", "exec"), namespace)
    agent = namespace["support_agent"]
    try:
        with start_worker(app, pool="solo", perform_ping_check=False):
            agent.delay("readme-function", question="Where is my refund?")
            assert agent.wait("readme-function", timeout=30) == "Where is my refund?"
    finally:
        app.close()


def test_the_tool_policies_send_the_store_s_downstream_key(
    redis_broker: str, redis_server: RedisServer
) -> None:
    app, prefix = app_of_its_own(redis_broker, "readme-tools")
    agentq.init_app(app, store=redis_server.url, prefix=prefix)
    refunds: list[tuple[str, int, str]] = []

    class Payments:
        @staticmethod
        def refund(order_id: str, amount: int, *, idempotency_key: str) -> str:
            refunds.append((order_id, amount, idempotency_key))
            return "re_1"

    namespace: dict[str, Any] = {"agentq": agentq, "payments": Payments, "sent_mail": bool}
    exec(compile(python_block("@agentq.tool(idempotent=True)"), "README.md", "exec"), namespace)

    class Tools(AgentTask):
        name = "tests.readme_tools"

        def start(self, run: Run) -> Done:
            refund = run.tool(namespace["refund"], "o-1", 250, key="call_1")
            run.tool(namespace["send_mail"], to="a@example.com", body="refunded", key="call_2")
            return Done(refund)

    agent: Tools = app.register_task(Tools())
    try:
        with start_worker(app, pool="solo", perform_ping_check=False):
            agent.delay("readme-tools")
            assert agent.wait("readme-tools", timeout=30) == "re_1"
        store = runtime_of(app).store
        assert refunds == [("o-1", 250, store.downstream_key("readme-tools", "call_1"))]
    finally:
        app.close()


def test_a_thread_sent_with_a_concurrency_key_holds_its_slot(
    redis_broker: str, redis_server: RedisServer
) -> None:
    app, prefix = app_of_its_own(redis_broker, "readme-keys")
    running, finish = threading.Event(), threading.Event()

    class Support(AgentTask):
        name = "support_agent"

        def start(self, run: Run, question: str) -> Done:
            running.set()
            finish.wait(timeout=30)
            return Done(question)

    namespace: dict[str, Any] = {
        "agentq": agentq,
        "app": app,
        "AgentTask": AgentTask,
        "support_agent": app.register_task(Support()),
    }
    setup, sent = on_servers(python_block("threads=3"), redis_server, prefix).split(
        "support_agent.apply_async("
    )
    exec(compile(setup, "README.md", "exec"), namespace)
    try:
        with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
            exec(compile("support_agent.apply_async(" + sent, "README.md", "exec"), namespace)
            assert running.wait(timeout=30)
            (state,) = runtime_of(app).store.key_states()
            assert (state.key, state.cap, state.running) == ("tenant:42", 3, ["ticket-981"])
            finish.set()
            assert namespace["support_agent"].wait("ticket-981", timeout=30) == "..."
        key_of = namespace["SupportAgent"].concurrency_key_of
        assert key_of(None, "ticket-982", {"tenant_id": 7}) == "tenant:7"
    finally:
        finish.set()
        app.close()


class GraphState(TypedDict):
    messages: Annotated[list[Any], add_messages]


def test_the_graph_task_snippet_answers_an_interrupt_and_claims_its_tool(
    redis_broker: str, redis_server: RedisServer
) -> None:
    app, prefix = app_of_its_own(redis_broker, "readme-graph")
    agentq.init_app(app, store=redis_server.url, prefix=prefix)
    refunds: list[str] = []

    class Payments:
        @staticmethod
        def refund(amount: int, idempotency_key: str) -> str:
            refunds.append(idempotency_key)
            return f"refunded {amount}"

    def ask(state: GraphState) -> dict[str, Any]:
        answer = interrupt("refund?")
        return {"messages": [("ai", f"approved: {answer['approved']}")]}

    def pay(state: GraphState) -> dict[str, Any]:
        return {"messages": [("ai", tool_call("call-1", Payments.refund, 25, idempotent=True))]}

    builder = StateGraph(GraphState)
    builder.add_node("ask", ask)
    builder.add_node("pay", pay)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", "pay")
    builder.add_edge("pay", END)
    namespace: dict[str, Any] = {
        "app": app,
        "builder": builder,
        "RateLimitError": type("RateLimitError", (Exception,), {}),
    }
    snippet = python_block("graph_task(app, builder").replace(
        '"redis://localhost:6379/1"', f"{redis_server.url!r}, prefix={prefix!r}"
    )
    setup, sent = snippet.split("support.delay(")
    send, answer = ("support.delay(" + sent).split("support.resume(")
    exec(compile(setup, "README.md", "exec"), namespace)
    support = namespace["support"]
    try:
        with start_worker(app, pool="solo", perform_ping_check=False):
            exec(compile(send, "README.md", "exec"), namespace)
            wait_until(lambda: support.thread("t-42").status == "waiting", timeout=30)
            exec(compile("support.resume(" + answer, "README.md", "exec"), namespace)
            final = support.wait("t-42", timeout=30)
        assert [message["content"] for message in final["messages"]] == [
            "refund my order",
            "approved: True",
            "refunded 25",
        ]
        assert len(refunds) == 1
    finally:
        app.close()


def test_the_connection_pool_snippet_gives_the_store_its_client(redis_server: RedisServer) -> None:
    app = Celery("readme-pool", set_as_current=False)
    namespace: dict[str, Any] = {"agentq": agentq, "app": app, "redis": redis}
    snippet = python_block("BlockingConnectionPool").replace(
        "redis://localhost:6379/1", redis_server.url
    )
    exec(compile(snippet, "README.md", "exec"), namespace)
    try:
        store = runtime_of(app).store
        assert store.client.connection_pool is namespace["pool"]  # type: ignore[attr-defined]
    finally:
        app.close()


TRACED_THREAD = """
import sys, types
from celery import Celery
from celery.contrib.testing.worker import start_worker
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt
from typing_extensions import TypedDict
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
import agentq
from agentq import AgentTask, Done

# The exporter the snippet imports, keeping the spans here instead of sending them.
exported = InMemorySpanExporter()
otlp = "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"
sys.modules[otlp] = types.SimpleNamespace(OTLPSpanExporter=lambda: exported)

broker, store, prefix, snippet = sys.argv[1:]
app = Celery("readme-traced", broker=broker, set_as_current=False)
app.conf.update(task_default_queue="agentq-test-" + prefix, worker_hijack_root_logger=False)
agentq.init_app(app, store=store, prefix=prefix)

class Support(AgentTask):
    name = "support_agent"

    def start(self, run, question):
        return "model"

    def model(self, run):
        return Done("refunded")

namespace = {"support_agent": app.register_task(Support())}
with start_worker(app, pool="solo", perform_ping_check=False):
    exec(snippet, namespace)
    namespace["support_agent"].wait("order-1042", timeout=30)
namespace["trace"].get_tracer_provider().force_flush()
spans = {span.name: span for span in exported.get_finished_spans()}
request = spans["POST /refunds"].context
for node in ("agentq.node start", "agentq.node model"):
    assert spans[node].context.trace_id == request.trace_id, node
    assert spans[node].parent.span_id == request.span_id, node
print("joined")
"""


def test_a_thread_started_under_a_span_joins_its_trace(
    redis_broker: str, redis_server: RedisServer
) -> None:
    # In a process of its own: a tracer provider is set once per process.
    prefix = f"readme{uuid.uuid4().hex[:8]}:"
    snippet = python_block("from opentelemetry import trace")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", TRACED_THREAD, redis_broker, redis_server.url, prefix, snippet],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("joined")


def test_the_settings_paragraph_names_every_setting() -> None:
    paragraph = README.read_text().split("**Settings**", 1)[1].split("\n\n", 1)[0]
    named = set(re.findall(r"`(\w+)`(?: \(|/)", paragraph))
    assert set(Settings.names()) <= named, sorted(set(Settings.names()) - named)
