"""The Celery app of a ``celery worker`` running :mod:`tests.support.http_agents`
(``-A tests.support.http_worker_app``), configured from the environment as
:mod:`tests.chaos.worker_app` is, plus ``AGENTQ_TEST_MODEL_URL``."""

from __future__ import annotations

import os

from tests.support.agents import make_app
from tests.support.http_agents import HTTP_AGENTS

app = make_app(
    broker=os.environ["AGENTQ_TEST_BROKER"],
    store=os.environ["AGENTQ_TEST_STORE"],
    prefix=os.environ["AGENTQ_TEST_PREFIX"],
    queue=os.environ["AGENTQ_TEST_QUEUE"],
    ledger_url=os.environ["AGENTQ_TEST_STORE"],
)
app.conf.worker_prefetch_multiplier = 1
# Every pool slot acks its own message, as the README tells users of many slots to allow.
app.conf.broker_transport_options = {
    "max_connections": int(os.environ["AGENTQ_TEST_CONCURRENCY"]) + 10
}
for agent in HTTP_AGENTS:
    app.register_task(agent())
