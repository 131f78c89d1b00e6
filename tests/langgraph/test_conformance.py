"""LangGraph's own checkpointer conformance suite, on each agentq store.

The suite drives the async methods (``aput``, ``aget_tuple``, ``alist``, ...), which run the
sync ones on a worker thread, so both halves of the saver are exercised.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from langgraph.checkpoint import conformance
from langgraph.checkpoint.conformance.capabilities import Capability

from agentq.langgraph import AgentqSaver
from agentq.store.contract import Store


@pytest.mark.parametrize("capability", [c.value for c in Capability])
def test_langgraph_conformance(store: Store, capability: str) -> None:
    @conformance.checkpointer_test(name=f"agentq-{capability}")
    async def factory() -> AsyncIterator[AgentqSaver]:
        yield AgentqSaver(store)

    report = asyncio.run(conformance.validate(factory, capabilities={capability}))
    result = report.results[capability]
    assert result.detected, f"{capability} is not implemented"
    assert result.passed, "\n".join(result.failures)
    assert result.tests_passed > 0
