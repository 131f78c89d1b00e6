"""A small user app checked by mypy --strict in ``test_typing.py``, never imported by the
tests. A line ending in ``# expect: <code> ...`` must fail to type-check with those error
codes; every other line must pass."""

from __future__ import annotations

from typing import Any, assert_type

from celery import Celery
from celery.result import AsyncResult

import agentq
from agentq import AgentTask, Done, Run, Status
from agentq.langgraph import atool_call, tool_call


def refund(amount: int) -> str:
    return f"refunded {amount}"


async def fetch(url: str) -> bytes:
    return url.encode()


@agentq.tool(idempotent=True)
def charge(order: str, cents: int, *, idempotency_key: str) -> dict[str, int]:
    return {order: cents}


async def acharge(order: str, cents: int, *, idempotency_key: str) -> dict[str, int]:
    return {order: cents}


def fenced(order: str, *, fencing_token: int) -> int:
    return fencing_token


def keyed_and_fenced(order: str, *, idempotency_key: str, fencing_token: int) -> float:
    return 1.0


def search(query: str, *, top_k: int = 3) -> list[str]:
    return [query] * top_k


CALL: dict[str, Any] = {"id": "call-1", "args": {"amount": 3}}
ARGS: tuple[Any, ...] = (3,)
OPTIONS: dict[str, Any] = {"idempotent": True}


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

    def forms(self, run: Run) -> None:
        assert_type(run.tool(refund, 3), str)
        assert_type(run.tool(refund, amount=3), str)
        assert_type(run.tool(charge, "o-1", 250, key="charge", idempotent=True), dict[str, int])
        assert_type(run.tool(fenced, "o-1", key="f"), int)
        assert_type(run.tool(keyed_and_fenced, "o-1", shared=True), float)
        assert_type(run.tool(search, "q", limit=("openai", "tenant:a"), cost=12), list[str])
        assert_type(run.tool(search, "q", limit="openai", cost=9, actual_cost=len), list[str])
        assert_type(run.tool(refund, key="k", limit="openai", actual_cost=len, amount=3), str)
        assert_type(run.tool(refund, key=CALL["id"], **CALL["args"]), str)
        assert_type(run.tool(charge, key=CALL["id"], **CALL["args"]), dict[str, int])
        assert_type(run.tool(refund, *ARGS, key="k", **OPTIONS), str)
        assert_type(run.tool(refund, 3, key="k", **OPTIONS), str)

    async def async_forms(self, run: Run) -> None:
        assert_type(await run.atool(fetch, "u", key="f"), bytes)
        assert_type(await run.atool(fetch, url="u"), bytes)
        assert_type(await run.atool(acharge, "o-1", 250, key="c"), dict[str, int])
        assert_type(await run.atool(fetch, key=CALL["id"], **CALL["args"]), bytes)
        assert_type(await run.atool(refund, 3, limit="openai"), str)
        assert_type(await run.atool(fetch, "u", limit="openai", actual_cost=len), bytes)
        assert_type(await run.atool(charge, "o-1", 250, key="c"), dict[str, int])
        assert_type(await run.atool(refund, key=CALL["id"], **CALL["args"]), str)

    def graph_forms(self) -> None:
        assert_type(tool_call("call-1", charge, "o-1", 250, idempotent=True), dict[str, int])
        assert_type(tool_call("call-1", refund, **CALL["args"]), str)
        assert_type(tool_call("call-1", search, "q", limit="openai", actual_cost=len), list[str])

    async def async_graph_forms(self) -> None:
        assert_type(await atool_call("call-1", fetch, "u"), bytes)
        charged = await atool_call("call-1", acharge, "o-1", 250, idempotent=True)
        assert_type(charged, dict[str, int])
        assert_type(await atool_call("call-1", fetch, idempotent=True, **CALL["args"]), bytes)
        assert_type(await atool_call("call-1", refund, 3, limit="openai"), str)
        assert_type(await atool_call("call-1", refund, idempotent=True, **CALL["args"]), str)

    def wrong(self, run: Run) -> str:
        count: int = run.tool(refund, 1)  # expect: assignment
        run.tool(refund, "1", key="k")  # expect: arg-type
        run.tool(refund, 1, 2, key="k")  # expect: call-arg arg-type
        run.tool(charge, "o-1", key="k")  # expect: arg-type
        run.tool(refund)  # expect: call-arg arg-type
        run.tool(refund, amunt=1)  # expect: call-overload
        run.tool(refund, 1, kye="k")  # expect: call-arg
        run.tool(refund, 1, cost="free")  # expect: call-arg
        run.tool(refund, 1, limit="openai", actual_cost=12)  # expect: call-arg
        run.tool(fenced, 1, key="f")  # expect: arg-type
        return str(count)

    async def wrong_async(self, run: Run) -> None:
        text: str = await run.atool(fetch, "x")  # expect: arg-type
        await run.atool(fetch, b"x")  # expect: arg-type
        await run.atool(fetch, "x", "y")  # expect: call-arg arg-type
        await run.atool(acharge, "o-1", key="c")  # expect: arg-type
        await run.atool(fetch, uri="x")  # expect: call-overload
        await run.atool(refund, "1")  # expect: arg-type
        await run.atool(refund, 1, 2)  # expect: call-arg arg-type
        await run.atool(refund)  # expect: call-arg arg-type
        await run.atool(refund, amunt=1)  # expect: call-overload
        print(text)

    def wrong_graph(self) -> None:
        tool_call("call-1", charge, 250, idempotent=True)  # expect: arg-type
        tool_call("call-1", refund, "3")  # expect: arg-type
        tool_call("call-1", refund, 3, limit="openai", actual_cost=12)  # expect: call-arg

    async def wrong_async_graph(self) -> None:
        text: str = await atool_call("call-1", fetch, "x")  # expect: arg-type
        await atool_call("call-1", acharge, 250, idempotent=True)  # expect: arg-type
        await atool_call("call-1", fetch, "x", "y")  # expect: call-arg arg-type
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
