"""The README's support agent, runnable.

    AGENTQ_STORE=redis://localhost:6379/1 celery -A examples.support_agent worker -E
    AGENTQ_STORE=redis://localhost:6379/1 python -m examples.support_agent t-1 "Refund order 42?"

Both name the store: the caller writes the thread there before it sends the message.

It answers with a scripted fake model and no network, unless OPENAI_API_KEY is set: then
it asks OpenAI's chat completions API (model from OPENAI_MODEL, default gpt-4o-mini). The
refund tool is idempotent: it forwards agentq's key as the payment service's
Idempotency-Key, so a worker killed between the refund and its record cannot refund twice.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

from celery import Celery

import agentq
from agentq import AgentTask, Done, Run

app = Celery("support", broker=os.environ.get("AGENTQ_BROKER", "redis://localhost:6379/0"))
app.conf.worker_prefetch_multiplier = 1
agentq.init_app(app, store=os.environ.get("AGENTQ_STORE", "sqlite:///agentq.db"))

REFUNDS: dict[str, dict[str, Any]] = {}
"""Stands in for the payment service: refunds by idempotency key."""

TOOL_SPEC = [{
    "type": "function",
    "function": {
        "name": "refund",
        "description": "Refund an order.",
        "parameters": {"type": "object", "properties": {
            "order_id": {"type": "string"}, "amount": {"type": "number"}},
            "required": ["order_id", "amount"]},
    },
}]  # fmt: skip


class RateLimitError(Exception):
    """A provider's 429; carries the response so agentq can read Retry-After."""

    def __init__(self, response: Any) -> None:
        super().__init__("rate limited")
        self.response = response


@agentq.tool(idempotent=True)
def refund(order_id: str, amount: float, *, idempotency_key: str) -> dict[str, Any]:
    record = REFUNDS.setdefault(idempotency_key, {"order_id": order_id, "amount": amount})
    return {"refund_id": f"re_{idempotency_key}", **record}


def fake_chat(messages: list[dict[str, Any]]) -> dict[str, Any]:
    if not any(m["role"] == "tool" for m in messages):
        return {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call-1",
                    "type": "function",
                    "function": {"name": "refund", "arguments": '{"order_id": "42", "amount": 30}'},
                }
            ],
        }
    return {"role": "assistant", "content": "I refunded 30 EUR for order 42.", "tool_calls": []}


def openai_chat(messages: list[dict[str, Any]]) -> dict[str, Any]:
    request = urllib.request.Request(
        "https://api.openai.com/v1/chat/completions",
        data=json.dumps({"model": os.environ.get("OPENAI_MODEL", "gpt-4o-mini"),
                         "messages": messages, "tools": TOOL_SPEC}).encode(),
        headers={"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}",
                 "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            message: dict[str, Any] = json.load(response)["choices"][0]["message"]
    except urllib.error.HTTPError as exc:
        if exc.code == 429:
            raise RateLimitError(exc) from exc
        raise
    message.setdefault("tool_calls", [])
    return {k: v for k, v in message.items() if v is not None}


def chat(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return openai_chat(messages) if os.environ.get("OPENAI_API_KEY") else fake_chat(messages)


class SupportAgent(AgentTask):
    name = "support_agent"
    retry_on = (RateLimitError,)
    append_only = ("messages",)

    def start(self, run: Run, question: str) -> str:
        run.state["messages"] = [
            {"role": "system", "content": "You are a support agent. Use tools to refund."},
            {"role": "user", "content": question},
        ]
        return "model"

    def model(self, run: Run) -> Any:
        reply = chat(run.state["messages"])
        run.state["messages"].append(reply)
        run.pending = reply["tool_calls"] or []
        return "tools" if run.pending else Done(reply["content"])

    def tools(self, run: Run) -> str:
        for call in run.pending:
            args = json.loads(call["function"]["arguments"])
            result = run.tool(refund, **args, key=call["id"])
            run.state["messages"].append(
                {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)}
            )
        run.pending = []
        return "model"


support_agent = app.register_task(SupportAgent())


if __name__ == "__main__":
    thread_id, question = sys.argv[1], " ".join(sys.argv[2:]) or "Where is my refund?"
    support_agent.delay(thread_id, question=question)
    print(support_agent.wait(thread_id, timeout=600))
