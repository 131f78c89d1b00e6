"""A small user app checked by mypy --strict in ``test_typing.py``, never imported by the
tests. A line ending in ``# expect: <code>`` must fail to type-check with that error code;
every other line must pass."""

from __future__ import annotations

from typing import assert_type

from celery import Celery
from celery.result import AsyncResult

import agentq
from agentq import AgentTask, Done, Run, Status


def refund(amount: int) -> str:
    return f"refunded {amount}"


async def fetch(url: str) -> bytes:
    return url.encode()


class OrderAgent(AgentTask):
    name = "typing.order_agent"

    def start(self, run: Run, amount: int) -> str:
        receipt = run.tool(refund, amount, key="refund")
        assert_type(receipt, str)
        run.state["receipt"] = receipt
        return "fetch"

    async def fetch(self, run: Run) -> Done:
        body = await run.atool(fetch, "https://example.com")
        assert_type(body, bytes)
        plain = await run.atool(refund, 3)
        assert_type(plain, str)
        return Done(len(body))

    def wrong(self, run: Run) -> str:
        count: int = run.tool(refund, 1)  # expect: assignment
        return str(count)

    async def wrong_async(self, run: Run) -> None:
        text: str = await run.atool(fetch, "x")  # expect: arg-type
        print(text)


assert_type(agentq.Done(1), Done)

app = Celery("typing")
# Celery's register_task is untyped: name the agent's class to keep its signatures.
order_agent: OrderAgent = app.register_task(OrderAgent())
sent = order_agent.delay("order-1", amount=3)
assert_type(sent, AsyncResult)
assert_type(order_agent.resume("order-1", {"approved": True}), AsyncResult)
assert_type(order_agent.thread("order-1").status, Status)
order_agent.delay(123)  # expect: arg-type
order_agent.wait(42)  # expect: arg-type
order_agent.delay("order-2", 3)  # expect: arg-type
