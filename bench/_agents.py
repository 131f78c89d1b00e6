"""The Celery app of the benchmarks' worker subprocesses: agents on a zero-latency fake model
or sleeping as if they waited for one, and the plain Celery tasks they are compared with.

Configured from the environment by :mod:`bench._cluster` (``BENCH_*`` variables, see
:func:`app_from_env`; ``BENCH_BROKER_CONNECTIONS`` optional). The "ledger" is a second,
non-persistent redis-server where tasks count what they finished, so the benchmark sees
completions without a result backend.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from typing import Any

import msgpack
import redis
from celery import Celery

import agentq
from agentq import AgentTask, Done, Run
from bench import _chat

ENV = ("BENCH_BROKER", "BENCH_STORE", "BENCH_LEDGER", "BENCH_PREFIX", "BENCH_QUEUE")


def chat_step(messages: list[dict[str, Any]], step: int, steps: int) -> bool:
    """What the fake model and tools add at ``step`` (from 1) of a ``steps``-step run: a
    reply asking for a tool, the tool's result, ..., and a final answer. True when done."""
    if step >= steps - 1:
        messages.append(_chat.answer(step))
        return True
    messages.append(_chat.reply(step) if step % 2 else _chat.tool_result(step - 1))
    return False


class StepsAgent(AgentTask):
    """``steps`` steps alternating a model node and a tools node; the model answers at once."""

    name = "bench.steps_agent"
    append_only = ("messages",)

    def start(self, run: Run, steps: int) -> str:
        run.state.update(messages=[_chat.user(0)], steps=steps)
        return "model"

    def model(self, run: Run) -> Any:
        if chat_step(run.state["messages"], run.step, run.state["steps"]):
            return Done(run.step + 1)
        run.pending = run.state["messages"][-1]["tool_calls"]
        return "tools"

    def tools(self, run: Run) -> Any:
        chat_step(run.state["messages"], run.step, run.state["steps"])
        run.pending = []
        return "model"


def messages_of(state_bytes: int) -> list[dict[str, Any]]:
    """A conversation of about ``state_bytes`` encoded bytes."""
    messages = [_chat.user(0)]
    while _chat.encoded_size(messages) < state_bytes:
        chat_step(messages, len(messages), 1 << 30)
    return messages


_TICKS: dict[str, list[float]] = {}
"""Node entry times of the threads this process drives (OverheadAgent only)."""


class OverheadAgent(AgentTask):
    """A node that does nothing, ``steps`` times, over a ~10 KB state (no append-only field:
    each step commits the whole state). Returns the time between consecutive node starts,
    i.e. one step's cost outside the node, taken in the worker process."""

    name = "bench.overhead_agent"

    def start(self, run: Run, steps: int, state_bytes: int) -> str:
        run.state.update(messages=messages_of(state_bytes), steps=steps)
        return "tick"

    def tick(self, run: Run) -> Any:
        ticks = _TICKS.setdefault(run.thread_id, [])
        ticks.append(time.perf_counter())
        if run.step < run.state["steps"] - 1:
            return "tick"
        del _TICKS[run.thread_id]
        return Done([b - a for a, b in itertools.pairwise(ticks)])


class OneStepAgent(AgentTask):
    """A whole run in one step: the RSS benchmark runs it thousands of times."""

    name = "bench.one_step_agent"

    def start(self, run: Run, question: str) -> Any:
        run.state["messages"] = [{"role": "user", "content": question}, _chat.answer(0)]
        return Done(len(run.state["messages"]))


class SleepAgent(AgentTask):
    """``steps`` steps whose node blocks ``wait`` seconds, as a model call does. Under
    ``-P gevent`` the worker is monkey-patched, so ``time.sleep`` yields to other greenlets."""

    name = "bench.sleep_agent"

    def start(self, run: Run, steps: int, wait: float) -> Any:
        run.state.update(steps=steps, wait=wait)
        return self.model(run)

    def model(self, run: Run) -> Any:
        time.sleep(run.state["wait"])
        return Done(run.step + 1) if run.step >= run.state["steps"] - 1 else "model"


class AsyncSleepAgent(AgentTask):
    """:class:`SleepAgent` with ``async def`` nodes awaiting ``asyncio.sleep``."""

    name = "bench.async_sleep_agent"

    async def start(self, run: Run, steps: int, wait: float) -> Any:
        run.state.update(steps=steps, wait=wait)
        return await self.model(run)

    async def model(self, run: Run) -> Any:
        await asyncio.sleep(run.state["wait"])
        return Done(run.step + 1) if run.step >= run.state["steps"] - 1 else "model"


_clients: dict[tuple[int, str], redis.Redis] = {}


CLIENT_CONNECTIONS = 100
"""Per process and URL. A task that finds them all busy waits for one: redis-py's default
pool fails past 100 instead, and under ``-P gevent -c 1000`` the plain tasks finishing
together would lose their count."""


def client(url: str) -> redis.Redis:
    """One client per process and URL (prefork children must not share a connection)."""
    key = (os.getpid(), url)
    if key not in _clients:
        pool = redis.BlockingConnectionPool.from_url(url, max_connections=CLIENT_CONNECTIONS)
        _clients[key] = redis.Redis.from_pool(pool)
    return _clients[key]


def make_app(
    *,
    broker: str,
    store: str,
    ledger: str,
    prefix: str,
    queue: str,
    broker_connections: int | None = None,
) -> Celery:
    """``broker_connections``: the Redis transport's ``max_connections`` (kombu's default,
    10, when ``None``), the connections one channel may open at once."""
    app = Celery("agentq-bench", broker=broker, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=1,
        bench_store=store,
        bench_ledger=ledger,
    )
    if broker_connections is not None:
        app.conf.broker_transport_options = {"max_connections": broker_connections}
    agentq.init_app(app, store=store, prefix=prefix)
    for agent in (StepsAgent, OverheadAgent, OneStepAgent, SleepAgent, AsyncSleepAgent):
        app.register_task(agent())

    @app.task(name="bench.raw_loop", shared=False)  # type: ignore[untyped-decorator]
    def raw_loop(key: str, steps: int, counter: str) -> None:
        """The steps agent's loop without agentq: each step one raw SET of the state."""
        store_client, messages = client(store), [_chat.user(0)]
        state = {"messages": messages, "steps": steps}
        store_client.set(key, msgpack.packb(state))
        for step in range(1, steps):
            chat_step(messages, step, steps)
            store_client.set(key, msgpack.packb(state))
        client(ledger).incr(counter)

    @app.task(name="bench.raw_ticks", shared=False)  # type: ignore[untyped-decorator]
    def raw_ticks(key: str, steps: int, state_bytes: int, out: str) -> None:
        """OverheadAgent's loop without agentq: each step one raw SET of the ~10 KB state.
        Pushes the time between consecutive step starts to ``out`` in the ledger."""
        store_client = client(store)
        state = {"messages": messages_of(state_bytes), "steps": steps}
        ticks = []
        for _ in range(steps):
            ticks.append(time.perf_counter())
            store_client.set(key, msgpack.packb(state))
        ticks.append(time.perf_counter())
        client(ledger).rpush(out, msgpack.packb([b - a for a, b in itertools.pairwise(ticks)]))

    # Acked late, as an AgentTask is, so both hold a prefetch slot for the whole run: under
    # -P gevent Celery's consumer loop takes up to 2 s after an ack to fetch the next message.
    @app.task(name="bench.sleep_loop", shared=False, acks_late=True)  # type: ignore[untyped-decorator]
    def sleep_loop(steps: int, wait: float, counter: str) -> None:
        """SleepAgent's waits without agentq; counts ``<counter>:started`` and ``counter``
        in the ledger, so the benchmark sees how many are in flight."""
        ledger_client = client(ledger)
        ledger_client.incr(f"{counter}:started")
        for _ in range(steps):
            time.sleep(wait)
        ledger_client.incr(counter)

    @app.task(name="bench.noop", shared=False)  # type: ignore[untyped-decorator]
    def noop(counter: str) -> None:
        """A bare Celery task: its only work is counting itself in the ledger (no fsync)."""
        client(ledger).incr(counter)

    return app


def app_from_env() -> Celery:
    values = {name: os.environ[name] for name in ENV}
    connections = os.environ.get("BENCH_BROKER_CONNECTIONS")
    return make_app(
        broker=values["BENCH_BROKER"],
        store=values["BENCH_STORE"],
        ledger=values["BENCH_LEDGER"],
        prefix=values["BENCH_PREFIX"],
        queue=values["BENCH_QUEUE"],
        broker_connections=int(connections) if connections else None,
    )
