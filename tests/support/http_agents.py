"""Agents that call a model API over HTTP with httpx, the client the openai and anthropic
SDKs wrap, each through one client made at import and shared by every node, as users make
theirs. Each makes ``calls`` model calls, one a step, naming its thread and call so that a
:mod:`tests.support.model_server` counts every call.

The clients' address is the worker's ``AGENTQ_TEST_MODEL_URL``; a process that only sends
threads never calls it.
"""

from __future__ import annotations

import os
from typing import Any

import httpx

from agentq import AgentTask, Done, Run

MODEL_URL = os.environ.get("AGENTQ_TEST_MODEL_URL", "http://localhost")

sync_client = httpx.Client(base_url=MODEL_URL)
async_client = httpx.AsyncClient(base_url=MODEL_URL)


class HttpSyncAgent(AgentTask):
    """Sync nodes on the shared ``httpx.Client``."""

    name = "tests.http_sync_agent"

    def start(self, run: Run, calls: int) -> str:
        run.state.update(calls=calls, answers=[])
        return "model"

    def model(self, run: Run) -> Any:
        return _answered(run, sync_client.post("/v1/chat", json=_ask(run)))


class HttpAsyncAgent(HttpSyncAgent):
    """``async def`` nodes on the shared ``httpx.AsyncClient``: made outside any loop, it
    binds its connections to agentq's loop on first use."""

    name = "tests.http_async_agent"

    async def model(self, run: Run) -> Any:
        return _answered(run, await async_client.post("/v1/chat", json=_ask(run)))


HTTP_AGENTS = (HttpSyncAgent, HttpAsyncAgent)


def _ask(run: Run) -> dict[str, Any]:
    call = len(run.state["answers"])
    return {"thread": run.thread_id, "call": call, "messages": [{"role": "user", "content": "hi"}]}


def _answered(run: Run, reply: httpx.Response) -> Any:
    reply.raise_for_status()
    run.state["answers"].append(reply.json()["content"])
    return "model" if len(run.state["answers"]) < run.state["calls"] else Done(run.state["answers"])
