"""The app of :mod:`bench.limits`' worker subprocesses (``-A bench._limits_app``): a fake
provider that refuses calls over its budget with a 429 and ``Retry-After``, an agent whose
calls take from an agentq limit of the same budget, and the plain Celery task that calls it
under Celery's per-worker ``rate_limit`` instead.

Configured from the environment: ``BENCH_BROKER``, ``BENCH_STORE``, ``BENCH_LEDGER`` (where
the provider keeps its budget and counts), ``BENCH_PREFIX``, ``BENCH_QUEUE``, ``BENCH_RPM``,
``BENCH_WORKERS``.
"""

from __future__ import annotations

import os
from typing import Any, Final

import redis
from celery import Celery, signals

import agentq
from agentq import AgentTask, Done, Run

PROVIDER_BURST: Final = 10
"""Requests the provider lets through at once, before its per-minute rate."""
LIMITER_BURST: Final = 5
"""What agentq's limit lets go at once: below the provider's, for the time a call takes
from its take to the provider."""

_PROVIDER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local interval, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = math.max(tonumber(redis.call('GET', KEYS[1]) or '0'), now) + interval
if tat - now > burst * interval then
  redis.call('RPUSH', KEYS[3], tostring(now))
  return tostring(tat - now - burst * interval)
end
redis.call('SET', KEYS[1], tostring(tat))
redis.call('RPUSH', KEYS[2], tostring(now))
return '0'
"""


class ProviderBusy(Exception):
    """The provider's 429."""

    def __init__(self, seconds: float) -> None:
        super().__init__("429 Too Many Requests")
        self.retry_after = seconds


class Provider:
    def __init__(self, url: str, ns: str, rpm: float) -> None:
        self.client = redis.Redis.from_url(url)
        self.script = self.client.register_script(_PROVIDER)
        self.keys = [f"{ns}:bucket", f"{ns}:ok", f"{ns}:refused"]
        self.rpm = rpm

    def call(self, tenant: str = "") -> str:
        waited = float(self.script(keys=self.keys, args=[60 / self.rpm, PROVIDER_BURST]))
        if waited > 0:
            raise ProviderBusy(waited)
        if tenant:
            self.client.incr(f"{self.keys[1]}:{tenant}")
        return "ok"


def make_app(env: dict[str, str]) -> Celery:
    rpm, workers = float(env["BENCH_RPM"]), int(env["BENCH_WORKERS"])
    app = Celery("agentq-bench-limits", broker=env["BENCH_BROKER"], set_as_current=False)
    app.conf.update(
        task_default_queue=env["BENCH_QUEUE"],
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
    )
    agentq.init_app(
        app,
        store=env["BENCH_STORE"],
        prefix=env["BENCH_PREFIX"],
        sweep_interval=0.2,
        max_attempts=1000,
        limits=[
            agentq.limit("provider", requests_per_minute=rpm, burst=LIMITER_BURST),
            # Caps 3:1 within the provider's budget, which then does not decide the share.
            agentq.limit("tenant:a", requests_per_minute=rpm * 3 / 4 * 0.8, burst=2),
            agentq.limit("tenant:b", requests_per_minute=rpm / 4 * 0.8, burst=2),
        ],
    )
    provider = Provider(env["BENCH_LEDGER"], env["BENCH_PREFIX"].rstrip(":"), rpm)

    class LimitedCalls(AgentTask):
        name = "bench.limited_calls"
        retry_on = (ProviderBusy,)

        def start(self, run: Run, calls: int, tenant: str = "") -> Done:
            keys = ["provider", f"tenant:{tenant}"] if tenant else "provider"
            for _ in range(calls):
                run.tool(provider.call, tenant, limit=keys)
            return Done(calls)

    @app.task(  # type: ignore[untyped-decorator]
        name="bench.rate_limited_call", bind=True, shared=False, rate_limit=f"{rpm / workers}/m"
    )
    def rate_limited_call(self: Any) -> str:
        try:
            return provider.call()
        except ProviderBusy as exc:
            raise self.retry(countdown=exc.retry_after, max_retries=None) from exc

    app.register_task(LimitedCalls())
    _count_active(provider.client, f"{env['BENCH_PREFIX']}active")
    return app


def _count_active(client: redis.Redis, key: str) -> None:
    """Keep ``key`` at the number of the fleet's pool slots running a task: the benchmark
    samples it to see how many slots wait on a budget rather than call."""

    def started(**_: Any) -> None:
        client.incr(key)

    def ended(**_: Any) -> None:
        client.decr(key)

    signals.task_prerun.connect(started, weak=False)
    signals.task_postrun.connect(ended, weak=False)


if "BENCH_RPM" in os.environ:
    app = make_app(dict(os.environ))
