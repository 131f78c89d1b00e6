"""The demo's agent: customer support on a scripted model, with a refund tool.

It is written the way a real agent is (model node, tools node, each one checkpoint), with
two additions for the show: it logs what it does to the ledger, and its refund tool can be
made to pause right after the refund, so the demo can kill the worker at that moment.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from typing import Any, Final

from agentq.celery.task import AgentTask
from agentq.demo.ledger import Ledger, open_ledger
from agentq.engine import tool_policy
from agentq.engine.run import Run
from agentq.outcomes import Done

ORDER: Final = "1042"
AMOUNT_CENTS: Final = 2599
QUESTION: Final = (
    f"Hi, I was charged twice for order #{ORDER} (€{AMOUNT_CENTS / 100:.2f} each). "
    "Could you refund the duplicate charge?"
)
SYSTEM_PROMPT: Final = "You are a support agent. Use the refund tool for duplicate charges."
PAUSE_AFTER_REFUND: Final = "pause-after-refund"
"""The switch that holds the refund tool between issuing the refund and returning."""
PAUSE_LIMIT: Final = 60.0
"""Seconds a paused tool waits for the demo to kill its worker before carrying on."""


def euros(cents: int) -> str:
    return f"€{cents / 100:.2f}"


def expected_answer(refund_id: str) -> str:
    return (
        f"I refunded the duplicate charge of {euros(AMOUNT_CENTS)} on order "
        f"#{ORDER} (refund {refund_id}). It will be back on your card in 3-5 business "
        "days."
    )


def scripted_model(thread_id: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A stand-in for an LLM, without network: the same conversation always gets the same
    reply. First it asks for a refund; once the refund's result is in, it answers."""
    results = [m for m in messages if m["role"] == "tool"]
    if not results:
        # Real tool-call ids are unique per call; this one is stable per thread.
        call_id = "call_" + hashlib.sha256(f"{thread_id}:refund".encode()).hexdigest()[:12]
        return {
            "role": "assistant",
            "content": "Let me refund the duplicate charge.",
            "tool_calls": [
                {
                    "id": call_id,
                    "name": "refund",
                    "args": {"order": ORDER, "cents": AMOUNT_CENTS, "reason": "duplicate charge"},
                }
            ],
        }
    refund_id = results[-1]["content"]["refund_id"]
    return {"role": "assistant", "content": expected_answer(refund_id), "tool_calls": []}


def _who() -> dict[str, int]:
    # The worker's main process is the pool process's parent: the pid the demo started.
    return {"pid": os.getpid(), "ppid": os.getppid()}


def refund_tool(ledger: Ledger) -> Callable[..., dict[str, Any]]:
    # tool_policy.tool returns Any, which mypy --strict refuses as a decorator.
    @tool_policy.tool(idempotent=True)
    def refund(order: str, cents: int, reason: str, *, idempotency_key: str) -> dict[str, Any]:
        """Refund through the payment service. Safe to run again after a crash: the
        idempotency key is forwarded, and the service answers a repeated key with the
        refund it already made."""
        made, issued = ledger.refund(idempotency_key, order, cents)
        ledger.record(
            "refund",
            key=idempotency_key,
            refund_id=made.refund_id,
            cents=cents,
            order=order,
            issued=issued,
            **_who(),
        )
        if ledger.take(PAUSE_AFTER_REFUND):
            ledger.record("paused", **_who())
            threading.Event().wait(PAUSE_LIMIT)  # the demo SIGKILLs this worker meanwhile
        return {"refund_id": made.refund_id, "order": order, "cents": cents}

    tool: Callable[..., dict[str, Any]] = refund
    return tool


class DemoSupportAgent(AgentTask):
    """start → model → tools → model → done: four steps, four checkpoints."""

    name = "agentq.demo.support_agent"

    def _ledger(self, run: Run, node: str) -> Ledger:
        ledger = open_ledger(self.app.conf.demo_ledger, self.app.conf.demo_namespace)
        # The lease this worker drives under, for the timeline's takeover line.
        ledger.record("node", step=run.step, node=node, token=run.token, **_who())
        return ledger

    def start(self, run: Run, question: str) -> str:
        with self._ledger(run, "start"):
            run.state["messages"] = [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": question},
            ]
        return "model"

    def model(self, run: Run) -> str | Done:
        with self._ledger(run, "model") as ledger:
            reply = scripted_model(run.thread_id, run.state["messages"])
            ledger.record("model_call", step=run.step, tool_calls=reply["tool_calls"], **_who())
        run.state["messages"].append(reply)
        run.pending = reply["tool_calls"]
        return "tools" if run.pending else Done(reply["content"])

    def tools(self, run: Run) -> str:
        with self._ledger(run, "tools") as ledger:
            refund = refund_tool(ledger)
            for call in run.pending:
                result = run.tool(refund, key=call["id"], **call["args"])
                run.state["messages"].append(
                    {"role": "tool", "tool_call_id": call["id"], "content": result}
                )
        run.pending = []
        return "model"
