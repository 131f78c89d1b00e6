"""Agents for the tests: a scripted fake model and tools that write to a ledger in Redis.

The ledger counts exactly what happened in the outside world: ``calls:<thread>`` how often
each tool ran (by key), ``effects:<thread>`` the effects a downstream service applied
(deduplicated by idempotency key, as a payment API would), ``model:<thread>`` how many
model calls were made. A crash point lets a test stop a worker at a chosen moment.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis
from celery import Celery

import agentq
from agentq import DID_NOT_RUN, AgentTask, Done, Interrupt, Run


class RateLimitError(Exception):
    """Shaped like a provider SDK's 429: the response carries Retry-After."""

    class Response:
        def __init__(self, headers: dict[str, str]) -> None:
            self.headers = headers

    def __init__(self, retry_after: str) -> None:
        super().__init__("429 Too Many Requests")
        self.response = self.Response({"Retry-After": retry_after})


class Ledger:
    """The outside world, as seen by the tests."""

    def __init__(self, url: str, namespace: str) -> None:
        self.client = redis.Redis.from_url(url, decode_responses=True)
        self.ns = namespace

    def key(self, *parts: str) -> str:
        return ":".join((self.ns, *parts))

    def model_calls(self, thread_id: str) -> int:
        return int(self.client.get(self.key("model", thread_id)) or 0)

    def tool_calls(self, thread_id: str) -> dict[str, int]:
        return {k: int(v) for k, v in self.client.hgetall(self.key("calls", thread_id)).items()}

    def effects(self, thread_id: str) -> dict[str, str]:
        return self.client.hgetall(self.key("effects", thread_id))

    def arm_crash(self, thread_id: str, point: str) -> None:
        """Make the worker that reaches ``point`` for this thread block there (once)."""
        self.client.set(self.key("crash", thread_id), point)

    def reached(self, thread_id: str, point: str) -> bool:
        return bool(self.client.exists(self.key("reached", thread_id, point)))

    def crash_point(self, thread_id: str, point: str) -> None:
        """Block here if a test armed this point: once (``arm_crash``), or every time
        (``crash-always``, for a thread that keeps killing its worker)."""
        if self.client.get(self.key("crash-always", thread_id)) != point:
            if self.client.get(self.key("crash", thread_id)) != point:
                return
            if not self.client.set(self.key("fired", thread_id, point), 1, nx=True):
                return
        self.client.set(self.key("reached", thread_id, point), time.time())
        # Blocks until the test kills this process; a real wait, not a sleep.
        while True:
            self.client.blpop([self.key("never", thread_id)], timeout=1)


def ledger_of(task: AgentTask) -> Ledger:
    conf = task.app.conf
    return Ledger(conf.test_ledger_url, conf.test_ledger_ns)


def fake_model(task: AgentTask, run: Run) -> dict[str, Any]:
    """Deterministic replies: one refund tool call per planned refund, then an answer."""
    ledger = ledger_of(task)
    calls = ledger.client.incr(ledger.key("model", run.thread_id))
    ledger.client.rpush(ledger.key("model-times", run.thread_id), time.time())
    plan = run.state["plan"]
    if calls <= plan.get("rate_limits", 0):
        raise RateLimitError(retry_after=str(plan.get("retry_after", 2)))
    ledger.crash_point(run.thread_id, "model")
    done = sum(1 for m in run.state["messages"] if m["role"] == "tool")
    if done < plan["refunds"]:
        call_id = f"call-refund-{done + 1}"
        return {"role": "assistant", "content": "",
                "tool_calls": [{"id": call_id, "name": "refund", "args": {"amount": 10}}]}
    return {"role": "assistant", "content": f"Refunded {done * 10} EUR.", "tool_calls": []}


def refund_tool(ledger: Ledger, thread_id: str) -> Any:
    def refund(amount: int, *, idempotency_key: str) -> dict[str, Any]:
        ledger.client.hincrby(ledger.key("calls", thread_id), idempotency_key, 1)
        ledger.client.hsetnx(ledger.key("effects", thread_id), idempotency_key, amount)
        ledger.crash_point(thread_id, "after_effect")
        return {"refund_id": f"re_{idempotency_key}", "amount": amount}

    return refund


class SupportAgent(AgentTask):
    """The README's agent, on the fake model. ``policy`` picks the refund tool's policy."""

    name = "tests.support_agent"
    retry_on = (RateLimitError,)

    def start(self, run: Run, question: str, refunds: int = 1, rate_limits: int = 0,
              retry_after: int = 2, policy: str = "idempotent") -> str:
        run.state["messages"] = [{"role": "user", "content": question}]
        run.state["plan"] = {"refunds": refunds, "rate_limits": rate_limits,
                             "retry_after": retry_after, "policy": policy}
        return "model"

    def model(self, run: Run) -> Any:
        reply = fake_model(self, run)
        run.state["messages"].append(reply)
        run.pending = reply["tool_calls"]
        return "tools" if run.pending else Done(reply["content"])

    def tools(self, run: Run) -> str:
        ledger = ledger_of(self)
        refund = refund_tool(ledger, run.thread_id)
        policy = run.state["plan"]["policy"]
        options: dict[str, Any] = {}
        if policy == "idempotent":
            options["idempotent"] = True
        elif policy == "reconcile":
            def reconcile(key: str, amount: int) -> Any:
                applied = ledger.client.hget(ledger.key("effects", run.thread_id), key)
                if applied is None:
                    return DID_NOT_RUN
                return {"refund_id": f"re_{key}", "amount": int(applied)}
            options["reconcile"] = reconcile
        for call in run.pending:
            result = run.tool(refund, call["args"]["amount"], key=call["id"], **options)
            run.state["messages"].append({"role": "tool", "content": result})
        run.pending = []
        ledger.crash_point(run.thread_id, "tools_end")
        return "model"


class ApprovalAgent(AgentTask):
    """Pauses for a human twice: with ``run.interrupt`` and by returning ``Interrupt``."""

    name = "tests.approval_agent"

    def start(self, run: Run, amount: int) -> str:
        run.state["amount"] = amount
        return "ask"

    def ask(self, run: Run) -> Any:
        decision = run.interrupt({"question": f"refund {run.state['amount']}?"})
        run.state["approved"] = decision["approved"]
        return Interrupt({"question": "anything else?"}, resume_at="finish")

    def finish(self, run: Run) -> Done:
        return Done({"approved": run.state["approved"], "note": run.resume_value})


class CountingAgent(AgentTask):
    """Counts to ``n``, one step each; ``slow`` seconds per step (a real blocking wait on
    the ledger, so a test can cancel or hand over mid-run); an async node for the last."""

    name = "tests.counting_agent"

    def start(self, run: Run, n: int, slow: float = 0.0) -> str:
        run.state.update(i=0, n=n, slow=slow)
        return "count"

    def count(self, run: Run) -> str:
        ledger = ledger_of(self)
        ledger.client.incr(ledger.key("steps", run.thread_id))
        if run.state["slow"]:
            ledger.client.blpop([ledger.key("never", run.thread_id)],
                                timeout=run.state["slow"])
        run.state["i"] += 1
        return "count" if run.state["i"] < run.state["n"] else "finish"

    async def finish(self, run: Run) -> Done:
        await asyncio.sleep(0)
        return Done(run.state["i"])


class BrokenAgent(AgentTask):
    """Fails with a bug until the ledger says it is fixed; or stores what cannot be stored."""

    name = "tests.broken_agent"

    def start(self, run: Run, mode: str) -> str:
        run.state["mode"] = mode
        return "work"

    def work(self, run: Run) -> Any:
        if run.state["mode"] == "unstorable":
            run.state["handle"] = object()
            return "work"
        if run.state["mode"] == "bad_return":
            return 42
        ledger = ledger_of(self)
        if not ledger.client.exists(ledger.key("fixed", run.thread_id)):
            raise KeyError("customer_id")
        return Done("fixed")


AGENTS = (SupportAgent, ApprovalAgent, CountingAgent, BrokenAgent)


def make_app(*, broker: str, store: str, prefix: str, queue: str, ledger_url: str,
             **settings: Any) -> Celery:
    app = Celery("agentq-tests", broker=broker, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        test_ledger_url=ledger_url,
        test_ledger_ns=prefix.rstrip(":"),
    )
    agentq.init_app(app, store=store, prefix=prefix, **settings)
    for agent in AGENTS:
        app.register_task(agent())
    return app
