"""A process that only sends (a web server's request threads) and calls ``delay()`` from
many threads at once: each caller's store write goes to Redis at once instead of waiting
for one of a worker process's few pooled connections."""

from __future__ import annotations

import contextlib
import threading
import uuid
from pathlib import Path
from typing import Any

import redis
from celery import Celery

import agentq
from agentq import AgentTask, Done, Run
from tests.support.redis_server import running_redis, wait_until

SENDERS = 16


class _SentAgent(AgentTask):
    name = "tests.threaded_sender_agent"

    def start(self, run: Run, word: str) -> Any:
        return Done(word)


def _store_clients(admin: redis.Redis, admin_name: str) -> int:
    return sum(1 for client in admin.client_list() if client["name"] != admin_name)


def test_sixteen_threads_sending_at_once_each_write_the_store_at_once(
    redis_broker: str, tmp_path: Path
) -> None:
    prefix = f"ts{uuid.uuid4().hex[:8]}:"
    app = Celery("agentq-threaded-sender", broker=redis_broker, set_as_current=False)
    app.conf.task_default_queue = f"agentq-test-{prefix}"
    app.register_task(_SentAgent())
    with running_redis(tmp_path) as server, contextlib.ExitStack() as stack:
        runtime = agentq.init_app(app, store=server.url, prefix=prefix)
        stack.callback(app.close)
        stack.callback(lambda: runtime.store.close())
        admin = stack.enter_context(contextlib.closing(server.client()))
        admin.client_setname("test-admin")
        agent = app.tasks[_SentAgent.name]
        # Writes wait in Redis until unpaused: every sender holds its connection there.
        admin.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")
        stack.callback(lambda: admin.execute_command("CLIENT", "UNPAUSE"))
        senders = [
            threading.Thread(target=agent.delay, args=(f"sent-{i}",), kwargs={"word": "hi"})
            for i in range(SENDERS)
        ]
        for sender in senders:
            sender.start()
        try:
            wait_until(
                lambda: _store_clients(admin, "test-admin") >= SENDERS,
                timeout=10,
                what=f"{SENDERS} store connections, one per sending thread",
            )
        finally:
            admin.execute_command("CLIENT", "UNPAUSE")
            for sender in senders:
                sender.join(30)
        assert all(runtime.store.meta(f"sent-{i}") is not None for i in range(SENDERS))
