"""The Celery app a ``celery worker`` subprocess loads in the LangGraph crash tests (``-A``).

Configured from the environment like :mod:`tests.support.worker_app`.
"""

from __future__ import annotations

import os

from tests.support.graphs import make_graph_app

app = make_graph_app(
    broker=os.environ["AGENTQ_TEST_BROKER"],
    store=os.environ["AGENTQ_TEST_STORE"],
    prefix=os.environ["AGENTQ_TEST_PREFIX"],
    queue=os.environ["AGENTQ_TEST_QUEUE"],
    ledger_url=os.environ["AGENTQ_TEST_LEDGER"],
    lease_ttl=float(os.environ.get("AGENTQ_TEST_LEASE_TTL", "2")),
    sweep_interval=0.2,
    start_grace=float(os.environ.get("AGENTQ_TEST_START_GRACE", "3")),
)
app.conf.worker_prefetch_multiplier = 1
