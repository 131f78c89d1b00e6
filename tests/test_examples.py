"""The shipped examples and docker-compose.yml work as their docs say."""

from __future__ import annotations

import ast
import importlib
import os
import re
import shlex
import uuid
from pathlib import Path

import pytest
import yaml
from celery import Celery
from celery.contrib.testing.worker import start_worker

import agentq
from agentq import AgentTask, Done, Run
from agentq.celery.runtime import runtime_of
from agentq.ops.doctor import celery_findings
from tests.support.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[1]


def test_support_agent_example_runs_end_to_end_on_the_fake_model(
    redis_broker: str, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("AGENTQ_BROKER", redis_broker)
    monkeypatch.setenv("AGENTQ_STORE", redis_server.url)
    module = importlib.import_module("examples.support_agent")
    module = importlib.reload(module)  # read this test's environment
    app = module.app
    app.conf.task_default_queue = f"agentq-example-{uuid.uuid4().hex[:8]}"
    app._agentq_runtime.settings = app._agentq_runtime.settings.__class__(
        store=redis_server.url, prefix=f"ex{uuid.uuid4().hex[:8]}:"
    )
    thread_id = "example-1"
    with start_worker(app, pool="solo", perform_ping_check=False):
        module.support_agent.delay(thread_id, question="Where is my refund for order 42?")
        answer = module.support_agent.wait(thread_id, timeout=30)
    assert answer == "I refunded 30 EUR for order 42."
    store = app._agentq_runtime.store
    assert list(module.REFUNDS) == [store.downstream_key(thread_id, "call-1")]
    messages = app._agentq_runtime.store.latest(thread_id).state["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]


def test_the_example_s_worker_and_caller_commands_use_one_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each command as its docstring writes it, usually typed in a shell of its own: a
    # caller that wrote the thread to another store than the worker's would wait forever
    # for a thread the worker drops as deleted.
    source = (ROOT / "examples" / "support_agent.py").read_text()
    docstring = ast.get_docstring(ast.parse(source))
    assert docstring is not None
    stores = {}
    for line in docstring.split("\n\n")[1].splitlines():
        words = shlex.split(line)
        for name in ("AGENTQ_STORE", "AGENTQ_BROKER"):
            monkeypatch.delenv(name, raising=False)
        while "=" in words[0]:
            name, _, value = words.pop(0).partition("=")
            monkeypatch.setenv(name, value)
        module = importlib.reload(importlib.import_module("examples.support_agent"))
        stores[words[0]] = runtime_of(module.app).settings.store
    assert set(stores) == {"celery", "python"}
    assert stores["celery"] == stores["python"], stores


def test_compose_file_runs_redis_with_durable_settings() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert set(compose["services"]) == {"redis", "worker", "flower"}
    args = compose["services"]["redis"]["command"].split()
    settings = {args[i]: args[i + 1] for i in range(1, len(args) - 1, 2)}
    assert settings == {
        "--appendonly": "yes",
        "--appendfsync": "always",
        "--maxmemory-policy": "noeviction",
    }
    worker = compose["services"]["worker"]
    assert "-E" in worker["command"].split()  # Flower needs task events
    assert worker["environment"]["AGENTQ_STORE"].startswith("redis://redis:6379/")
    assert os.path.exists(ROOT / "examples" / "support_agent.py")


def test_deploy_guide_settings_pass_doctor() -> None:
    guide = (ROOT / "examples" / "deploy_survival.md").read_text()
    config = re.search(r"```python\n(.*?)```", guide, re.S)
    assert config is not None
    settings: dict[str, object] = {}
    exec(compile(config.group(1), "celeryconfig.py", "exec"), {}, settings)
    app = Celery("deploy", set_as_current=False)
    app.conf.update(settings)
    agentq.init_app(app)
    app.register_task(_GuideAgent())
    assert settings["agentq_lease_ttl"] == runtime_of(app).settings.lease_ttl
    assert celery_findings(app, runtime_of(app).settings) == []
    app.conf.worker_prefetch_multiplier = 4  # and the check is not empty by construction
    assert [f.setting for f in celery_findings(app, runtime_of(app).settings)] == [
        "worker_prefetch_multiplier"
    ]


class _GuideAgent(AgentTask):
    name = "deploy_guide_agent"

    def start(self, run: Run) -> Done:
        return Done(None)
