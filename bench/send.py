"""How fast a caller starts threads: ``agent.delay()`` per second ÷ a plain Celery task's
``delay()`` per second, from one sending thread and from 16 (a web server's request
threads), with no worker running.

Run from the repository root::

    python -m bench.send [--quick]

Two private ``redis-server``\\ s with AOF always (see :mod:`bench._redis`): the broker, and
the agentq store, opened as a process that is not a worker opens it. An agent's
``delay()`` writes the thread to the store (one fsync'd script call) before its message
goes to the broker; a plain task's sends the message alone. The agent and the plain task
send in alternating blocks of the same size, new thread ids each time; each rate is the
median over the blocks. ``ratio send_agent_over_plain_1_thread`` and
``ratio send_agent_over_plain_16_threads``: agent sends/s ÷ plain sends/s.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from bench._agents import make_app
from bench._redis import PrivateRedis
from bench._report import Result, exit_with, median, standalone

THREADS = (1, 16)


def _rate(send: Callable[[int], object], count: int, pool: ThreadPoolExecutor | None) -> float:
    """Sends per second of ``count`` calls of ``send``, in this thread or spread on ``pool``."""
    started = time.perf_counter()
    if pool is None:
        for i in range(count):
            send(i)
    else:
        list(pool.map(send, range(count)))
    return count / (time.perf_counter() - started)


def run(quick: bool) -> list[Result]:
    blocks, block = (3, 50) if quick else (7, 300)
    results = []
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(PrivateRedis())
        broker = stack.enter_context(PrivateRedis())
        broker_url = f"redis://127.0.0.1:{broker.port}/0"
        app = make_app(
            broker=broker_url,
            store=f"redis://127.0.0.1:{store.port}/0",
            ledger=broker_url,
            prefix="send:",
            queue=f"agentq-bench-send-{uuid.uuid4().hex[:8]}",
        )
        stack.callback(app.close)
        agent, plain = app.tasks["bench.sleep_agent"], app.tasks["bench.sleep_loop"]
        stack.callback(lambda: app._agentq_runtime.store.close())

        def send_agent(_: int) -> object:
            return agent.delay(uuid.uuid4().hex, steps=1, wait=0.0)

        def send_plain(_: int) -> object:
            return plain.delay(1, 0.0, "plain")

        send_agent(0), send_plain(0)  # connections opened, scripts loaded
        for threads in THREADS:
            agent_rates, plain_rates = [], []
            with ThreadPoolExecutor(threads) if threads > 1 else contextlib.nullcontext() as pool:
                for _ in range(blocks):
                    agent_rates.append(_rate(send_agent, block, pool))
                    plain_rates.append(_rate(send_plain, block, pool))
            measured, base = median(agent_rates), median(plain_rates)
            plural = "s" if threads > 1 else ""
            results.append(
                Result(
                    "ratio",
                    f"send_agent_over_plain_{threads}_thread{plural}",
                    measured / base,
                    f"delay() per second from {threads} thread{plural}, agent ÷ plain task",
                    f"{measured:.0f}/s",
                    f"{base:.0f}/s",
                )
            )
    return results


def main(argv: list[str] | None = None) -> int:
    return standalone("python -m bench.send", __doc__, run, argv)


if __name__ == "__main__":
    exit_with(main)
