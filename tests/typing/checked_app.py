"""A small user app checked by mypy --strict in ``test_typing.py``, never imported by the
tests. A line ending in ``# expect: <code>`` must fail to type-check with that error code;
every other line must pass."""

from __future__ import annotations

from typing import assert_type

import agentq
from agentq import AgentTask, Done, Run


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
