"""The README's snippets run as written, given the names they leave to the reader."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

import agentq
from agentq import AgentTask, Done, Run
from agentq.celery.runtime import runtime_of
from agentq.errors import ThreadStopped
from agentq.ops.doctor import celery_findings
from tests.support.redis_server import RedisServer

README = Path(__file__).resolve().parents[1] / "README.md"


def python_block(containing: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    (block,) = [block for block in blocks if containing in block]
    return block


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
    prefix = f"readme{uuid.uuid4().hex[:8]}:"
    app = Celery("readme-limits", broker=broker, set_as_current=False)
    app.conf.update(task_default_queue=f"agentq-test-{prefix}", worker_hijack_root_logger=False)
    namespace: dict[str, Any] = {
        "agentq": agentq,
        "app": app,
        "llm": ChatClient,
        "estimate_tokens": lambda messages: 100,
    }
    snippet = snippet.replace(
        'store="redis://localhost:6379/1"', f"store={server.url!r}, prefix={prefix!r}"
    )
    exec(compile(snippet, "README.md", "exec"), namespace)
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
