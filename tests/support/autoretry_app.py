"""The app of a ``celery worker`` subprocess (``-A``) that registers an agent with
``autoretry_for``, which the worker must refuse to start with."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

import agentq
from agentq import AgentTask, Done, Run


class Flaky(Exception):
    pass


class Agent(AgentTask):
    name = "tests.registered_with_autoretry"

    def start(self, run: Run) -> Any:
        return Done(None)


def make(broker: str, store: str, prefix: str, queue: str) -> Celery:
    app = Celery("autoretry", broker=broker, set_as_current=False)
    app.conf.update(task_default_queue=queue, broker_connection_retry_on_startup=True)
    agentq.init_app(app, store=store, prefix=prefix)
    app.register_task(Agent(), autoretry_for=(Flaky,))
    return app


if "AGENTQ_TEST_BROKER" in os.environ:
    app = make(
        os.environ["AGENTQ_TEST_BROKER"],
        os.environ["AGENTQ_TEST_STORE"],
        os.environ["AGENTQ_TEST_PREFIX"],
        os.environ["AGENTQ_TEST_QUEUE"],
    )
