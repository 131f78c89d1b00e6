"""The Celery app a chaos or recovery-bench ``celery worker`` loads (``-A``).

Configured from the environment by :class:`tests.support.chaos.ChaosCluster`. Besides the
test agents it holds :class:`~tests.support.agents.ChaosAgent`, its async twin
:class:`~tests.support.agents.AsyncChaosAgent`, and ``plain_task``, a plain ``acks_late``
Celery task for comparing recovery with Celery's own.
"""

from __future__ import annotations

import os

from tests.support.agents import AsyncChaosAgent, ChaosAgent, ChaosLedger, make_app

app = make_app(
    broker=os.environ["AGENTQ_TEST_BROKER"],
    store=os.environ["AGENTQ_TEST_STORE"],
    prefix=os.environ["AGENTQ_TEST_PREFIX"],
    queue=os.environ["AGENTQ_TEST_QUEUE"],
    ledger_url=os.environ["AGENTQ_TEST_LEDGER"],
    lease_ttl=float(os.environ["AGENTQ_TEST_LEASE_TTL"]),
    sweep_interval=float(os.environ.get("AGENTQ_TEST_SWEEP_INTERVAL", "0.2")),
    start_grace=float(os.environ.get("AGENTQ_TEST_START_GRACE", "3")),
    max_crashes=int(os.environ.get("AGENTQ_TEST_MAX_CRASHES", "3")),
    keep_last=int(os.environ.get("AGENTQ_TEST_KEEP_LAST", "1000")),
)
app.conf.worker_prefetch_multiplier = 1
if os.environ.get("AGENTQ_TEST_SOFT_SHUTDOWN"):
    app.conf.worker_soft_shutdown_timeout = float(os.environ["AGENTQ_TEST_SOFT_SHUTDOWN"])
if os.environ.get("AGENTQ_TEST_BACKEND"):
    app.conf.result_backend = os.environ["AGENTQ_TEST_BACKEND"]
# Every pool slot acks its own message, as the README tells users of many slots to allow.
slots = int(os.environ.get("AGENTQ_TEST_CONCURRENCY", "0"))
app.conf.broker_transport_options = {"max_connections": slots + 10}
app.register_task(ChaosAgent())
app.register_task(AsyncChaosAgent())


@app.task(name="tests.plain_task", acks_late=True)  # type: ignore[untyped-decorator]
def plain_task(run_id: str, seconds: float) -> str:
    """A plain Celery task with ``acks_late=True`` and nothing else: records each start in
    the ledger, then works for ``seconds``."""
    ledger = ChaosLedger(app.conf.test_ledger_url, app.conf.test_ledger_ns)
    ledger.record_start(run_id, 0, "plain")
    ledger.client.blpop([ledger.key("never", run_id)], timeout=seconds)
    return run_id
