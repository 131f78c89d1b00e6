"""Agents for the tests: a scripted fake model and tools that write to a ledger in Redis.

The ledger counts exactly what happened in the outside world: ``calls:<thread>`` how often
each tool ran (by key), ``effects:<thread>`` the effects a downstream service applied
(deduplicated by idempotency key, as a payment API would), ``model:<thread>`` how many
model calls were made. A crash point lets a test stop a worker at a chosen moment.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
import uuid
from typing import Any, ClassVar, NamedTuple, TypeVar

import redis
from celery import Celery

import agentq
from agentq import DID_NOT_RUN, AgentTask, Done, Interrupt, Run
from agentq.store.contract import Store

V = TypeVar("V")


class RateLimitError(Exception):
    """Shaped like a provider SDK's 429: the response carries Retry-After."""

    class Response:
        def __init__(self, headers: dict[str, str]) -> None:
            self.headers = headers

    def __init__(self, retry_after: str) -> None:
        super().__init__("429 Too Many Requests")
        self.response = self.Response({"Retry-After": retry_after})


class Ledger:
    """The outside world, as seen by the tests."""

    def __init__(self, url: str, namespace: str, store: Store | None = None) -> None:
        # Blocking, as an HTTP client's pool is: a thousand tool calls in flight in one
        # process wait for a connection rather than fail as the outside world's fault.
        self.client = redis.Redis.from_pool(
            redis.BlockingConnectionPool.from_url(
                url, decode_responses=True, max_connections=100, timeout=60
            )
        )
        self.ns = namespace
        self.store = store
        """The threads' store, which :meth:`sent` reads the keys' incarnation from."""

    def key(self, *parts: str) -> str:
        return ":".join((self.ns, *parts))

    def sent(self, thread_id: str, key: str) -> str:
        """The ``idempotency_key`` a tool of the thread received for effect ``key``: the
        tools record what they received, as a downstream service would see it."""
        assert self.store is not None, "a ledger that names keys needs the threads' store"
        return self.store.downstream_key(thread_id, key)

    def as_sent(self, thread_id: str, by_key: dict[str, V]) -> dict[str, V]:
        """``by_key`` (effect key -> value) keyed as the tools received the keys."""
        return {self.sent(thread_id, key): value for key, value in by_key.items()}

    def model_calls(self, thread_id: str) -> int:
        return int(self.client.get(self.key("model", thread_id)) or 0)

    def tool_calls(self, thread_id: str) -> dict[str, int]:
        return {k: int(v) for k, v in self.client.hgetall(self.key("calls", thread_id)).items()}

    def effects(self, thread_id: str) -> dict[str, str]:
        return self.client.hgetall(self.key("effects", thread_id))

    def arm_crash(self, thread_id: str, point: str) -> None:
        """Make the worker that reaches ``point`` for this thread block there (once)."""
        self.client.set(self.key("crash", thread_id), point)

    def reached(self, thread_id: str, point: str) -> bool:
        return bool(self.client.exists(self.key("reached", thread_id, point)))

    def crash_point(self, thread_id: str, point: str) -> None:
        """Block here if a test armed this point: once (``arm_crash``), or every time
        (``crash-always``, for a thread that keeps killing its worker)."""
        if self.client.get(self.key("crash-always", thread_id)) != point:
            if self.client.get(self.key("crash", thread_id)) != point:
                return
            if not self.client.set(self.key("fired", thread_id, point), 1, nx=True):
                return
        self.client.set(self.key("reached", thread_id, point), time.time())
        # Blocks until the test kills this process; a real wait, not a sleep.
        while True:
            self.client.blpop([self.key("never", thread_id)], timeout=1)


def ledger_of(task: AgentTask) -> Ledger:
    conf = task.app.conf
    return Ledger(conf.test_ledger_url, conf.test_ledger_ns)


def fake_model(task: AgentTask, run: Run) -> dict[str, Any]:
    """Deterministic replies: one refund tool call per planned refund, then an answer."""
    ledger = ledger_of(task)
    calls = ledger.client.incr(ledger.key("model", run.thread_id))
    ledger.client.rpush(ledger.key("model-times", run.thread_id), time.time())
    plan = run.state["plan"]
    if calls <= plan.get("rate_limits", 0):
        raise RateLimitError(retry_after=str(plan.get("retry_after", 2)))
    ledger.crash_point(run.thread_id, "model")
    done = sum(1 for m in run.state["messages"] if m["role"] == "tool")
    if done < plan["refunds"]:
        call_id = f"call-refund-{done + 1}"
        return {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": call_id, "name": "refund", "args": {"amount": 10}}],
        }
    return {"role": "assistant", "content": f"Refunded {done * 10} EUR.", "tool_calls": []}


def refund_tool(ledger: Ledger, thread_id: str) -> Any:
    def refund(amount: int, *, idempotency_key: str) -> dict[str, Any]:
        ledger.client.hincrby(ledger.key("calls", thread_id), idempotency_key, 1)
        ledger.client.hsetnx(ledger.key("effects", thread_id), idempotency_key, amount)
        ledger.crash_point(thread_id, "after_effect")
        return {"refund_id": f"re_{idempotency_key}", "amount": amount}

    return refund


class SupportAgent(AgentTask):
    """The README's agent, on the fake model. ``policy`` picks the refund tool's policy:
    ``idempotent``, ``reconcile``, ``shared`` (neither, its keys shared across threads) or
    ``none``."""

    name = "tests.support_agent"
    retry_on = (RateLimitError,)
    append_only = ("messages",)

    def start(
        self,
        run: Run,
        question: str,
        refunds: int = 1,
        rate_limits: int = 0,
        retry_after: int = 2,
        policy: str = "idempotent",
    ) -> str:
        run.state["messages"] = [{"role": "user", "content": question}]
        run.state["plan"] = {
            "refunds": refunds,
            "rate_limits": rate_limits,
            "retry_after": retry_after,
            "policy": policy,
        }
        return "model"

    def model(self, run: Run) -> Any:
        reply = fake_model(self, run)
        run.state["messages"].append(reply)
        run.pending = reply["tool_calls"]
        return "tools" if run.pending else Done(reply["content"])

    def tools(self, run: Run) -> str:
        ledger = ledger_of(self)
        refund = refund_tool(ledger, run.thread_id)
        policy = run.state["plan"]["policy"]
        options: dict[str, Any] = {}
        if policy == "idempotent":
            options["idempotent"] = True
        elif policy == "reconcile":

            def reconcile(key: str, amount: int) -> Any:
                applied = ledger.client.hget(ledger.key("effects", run.thread_id), key)
                if applied is None:
                    return DID_NOT_RUN
                return {"refund_id": f"re_{key}", "amount": int(applied)}

            options["reconcile"] = reconcile
        elif policy == "shared":
            options["shared"] = True
        for call in run.pending:
            result = run.tool(refund, call["args"]["amount"], key=call["id"], **options)
            run.state["messages"].append({"role": "tool", "content": result})
        run.pending = []
        ledger.crash_point(run.thread_id, "tools_end")
        return "model"


class ApprovalAgent(AgentTask):
    """Pauses for a human twice: with ``run.interrupt`` and by returning ``Interrupt``."""

    name = "tests.approval_agent"

    def start(self, run: Run, amount: int) -> str:
        run.state["amount"] = amount
        return "ask"

    def ask(self, run: Run) -> Any:
        decision = run.interrupt({"question": f"refund {run.state['amount']}?"})
        run.state["approved"] = decision["approved"]
        return Interrupt({"question": "anything else?"}, resume_at="finish")

    def finish(self, run: Run) -> Done:
        return Done({"approved": run.state["approved"], "note": run.resume_value})


class NotesAgent(AgentTask):
    """Keeps a list of notes and waits for a human between two of them: a test can change
    the agent's declaration (``append_only``) while a thread waits."""

    name = "tests.notes_agent"

    def start(self, run: Run, first: str) -> str:
        run.state["notes"] = [first]
        return "ask"

    def ask(self, run: Run) -> Interrupt:
        run.state["notes"].append("asked")
        return Interrupt({"question": "next note?"}, resume_at="write")

    def write(self, run: Run) -> str:
        run.state["notes"].append(run.resume_value)
        return "finish"

    def finish(self, run: Run) -> Done:
        run.state["notes"].append("done")
        return Done(run.state["notes"])


class FlakyToolAgent(AgentTask):
    """Calls a plain tool (neither idempotent nor reconcilable) whose first call fails as
    ``mode`` says: ``rate_limit`` (a 429 with Retry-After: refused before any effect) or
    ``timeout`` (after the effect; retried too, as ``retry_on`` lists timeouts for the
    model's sake); ``async`` and ``async_as_sync`` call an ``async def`` tool, the right
    way and the wrong way."""

    name = "tests.flaky_tool_agent"
    retry_on = (RateLimitError, TimeoutError)

    def start(self, run: Run, mode: str) -> str:
        run.state["mode"] = mode
        return "pay_async" if mode.startswith("async") else "pay"

    def pay(self, run: Run) -> Done:
        ledger, mode = ledger_of(self), run.state["mode"]

        def charge(amount: int) -> str:
            calls = ledger.client.hincrby(ledger.key("calls", run.thread_id), "charge", 1)
            if calls == 1 and mode == "rate_limit":
                raise RateLimitError("0")
            ledger.client.hincrby(ledger.key("effects", run.thread_id), "charge", amount)
            if calls == 1 and mode == "timeout":
                raise TimeoutError("the payment API did not answer")
            return f"charged {amount}"

        return Done(run.tool(charge, 5, key="charge-1"))

    async def pay_async(self, run: Run) -> Done:
        ledger = ledger_of(self)

        async def charge(amount: int) -> str:
            await asyncio.sleep(0)
            ledger.client.hincrby(ledger.key("calls", run.thread_id), "charge", 1)
            return f"charged {amount}"

        def charge_now(amount: int) -> str:
            ledger.client.hincrby(ledger.key("calls", run.thread_id), "charge", 1)
            return f"charged {amount}"

        if run.state["mode"] == "async_as_sync":
            return Done(run.tool(charge, 5, key="charge-1"))
        if run.state["mode"] == "async_plain":
            return Done(await run.atool(charge_now, 5, key="charge-1"))
        return Done(await run.atool(charge, 5, key="charge-1"))


class CountingAgent(AgentTask):
    """Counts to ``n``, one step each; ``slow`` seconds per step (a real blocking wait on
    the ledger, so a test can cancel or hand over mid-run); an async node for the last."""

    name = "tests.counting_agent"

    def start(self, run: Run, n: int, slow: float = 0.0) -> str:
        run.state.update(i=0, n=n, slow=slow)
        return "count"

    def count(self, run: Run) -> str:
        ledger = ledger_of(self)
        ledger.client.incr(ledger.key("steps", run.thread_id))
        if run.state["slow"]:
            ledger.client.blpop([ledger.key("never", run.thread_id)], timeout=run.state["slow"])
        run.state["i"] += 1
        return "count" if run.state["i"] < run.state["n"] else "finish"

    async def finish(self, run: Run) -> Done:
        await asyncio.sleep(0)
        return Done(run.state["i"])


class NappingAgent(AgentTask):
    """Two ``async def`` steps, each awaiting an async tool that naps ``seconds`` under its
    claim; the result says which process and event loop ran them and when each nap began
    and ended, so a test can see many threads' naps overlap on one loop."""

    name = "tests.napping_agent"

    async def start(self, run: Run, seconds: float) -> str:
        run.state["seconds"] = seconds
        run.state["naps"] = [await self._nap(run, "first")]
        return "again"

    async def again(self, run: Run) -> Done:
        run.state["naps"].append(await self._nap(run, "second"))
        loop = id(asyncio.get_running_loop())
        return Done({"pid": os.getpid(), "loop": loop, "naps": run.state["naps"]})

    async def _nap(self, run: Run, key: str) -> list[float]:
        async def nap(seconds: float) -> list[float]:
            began = time.time()
            await asyncio.sleep(seconds)
            return [began, time.time()]

        nap_span: list[float] = await run.atool(nap, run.state["seconds"], key=key)
        return nap_span


class TracedToolAgent(AgentTask):
    """A sync and an async tool that each start a span of their own, as an instrumented
    HTTP client does inside a tool (opentelemetry is imported only when one runs)."""

    name = "tests.traced_tool_agent"

    def start(self, run: Run) -> str:
        def lookup(order: str) -> str:
            from opentelemetry import trace

            with trace.get_tracer("tests").start_as_current_span("tests.inside lookup"):
                return order

        run.tool(lookup, "o1", key="lookup")
        return "fetch"

    async def fetch(self, run: Run) -> Done:
        async def fetch(order: str) -> str:
            from opentelemetry import trace

            with trace.get_tracer("tests").start_as_current_span("tests.inside fetch"):
                await asyncio.sleep(0)
                return order

        return Done(await run.atool(fetch, "o1", key="fetch"))


class StallingAgent(AgentTask):
    """Its node's first run waits for the test's go on the ledger, then fails with a rate
    limit (a retry its worker schedules); every later run finishes at once. A worker
    frozen in the first run finds, once thawed, that another finished the thread."""

    name = "tests.stalling_agent"
    retry_on = (RateLimitError,)

    def start(self, run: Run) -> str:
        return "stall"

    def stall(self, run: Run) -> Done:
        ledger = ledger_of(self)
        if ledger.client.incr(ledger.key("stalls", run.thread_id)) == 1:
            ledger.client.blpop([ledger.key("go", run.thread_id)], timeout=60)
            raise RateLimitError("0")
        return Done("finished")


class BrokenAgent(AgentTask):
    """Fails with a bug until the ledger says it is fixed; or stores what cannot be stored,
    returns nonsense, or edits its append-only log."""

    name = "tests.broken_agent"
    append_only = ("log",)

    def start(self, run: Run, mode: str) -> str:
        run.state.update(mode=mode, log=["started"])
        return "work"

    def work(self, run: Run) -> Any:
        if run.state["mode"] == "rewrite_history":
            run.state["log"][0] = "rewritten"
            return Done("should not finish")
        if run.state["mode"] == "unstorable":
            run.state["handle"] = object()
            return "work"
        if run.state["mode"] == "bad_return":
            return 42
        ledger = ledger_of(self)
        if not ledger.client.exists(ledger.key("fixed", run.thread_id)):
            raise KeyError("customer_id")
        return Done("fixed")


class Arrival(NamedTuple):
    """A tool call as the downstream service saw it arrive."""

    token: int
    """The fencing token the call carried."""
    group: int
    """The process group of the worker that made it."""


class ChaosLedger(Ledger):
    """The outside world of :class:`ChaosAgent`, written so that a command redis-py resends
    after a lost reply (the server was killed after executing it) changes nothing twice:
    every tool invocation carries a fresh attempt id, and what it records is a hash field.

    ``arrivals:<thread>`` maps ``<tool>:<key>|<attempt>``, one field per time a tool
    function really ran, to ``<n> <token> <group>``: its place in the order the calls
    reached the service, the fencing token it carried and the process group (the worker)
    that made it. ``effects:<thread>`` maps ``<tool>:<key>`` to the applied value, set once.
    ``starts:<thread>`` lists ``{"step", "node", "pid", "t"}`` per node start.
    """

    # One script, so that the call's place in the order is the number of calls before it,
    # even when redis-py resends it after a lost reply.
    _APPLY = """
    if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
        local n = redis.call('HLEN', KEYS[1])
        redis.call('HSET', KEYS[1], ARGV[1], n .. ' ' .. ARGV[4] .. ' ' .. ARGV[5])
    end
    redis.call('HSETNX', KEYS[2], ARGV[2], ARGV[3])
    """

    def record_start(self, thread_id: str, step: int, node: str) -> None:
        entry = {"step": step, "node": node, "pid": os.getpid(), "t": time.time()}
        self.client.rpush(self.key("starts", thread_id), json.dumps(entry))

    def starts(self, thread_id: str) -> list[dict[str, Any]]:
        return [json.loads(e) for e in self.client.lrange(self.key("starts", thread_id), 0, -1)]

    def apply(self, thread_id: str, tool: str, key: str, value: Any, token: int) -> None:
        """One invocation of ``tool`` with fencing token ``token`` reaching the downstream
        service, atomically."""
        keys = [self.key(kind, thread_id) for kind in ("arrivals", "effects")]
        member = f"{tool}:{key}|{uuid.uuid4().hex}"
        args = (member, f"{tool}:{key}", json.dumps(value), token, os.getpgrp())
        self.client.eval(self._APPLY, len(keys), *keys, *args)

    def arrivals(self, thread_id: str) -> dict[str, list[Arrival]]:
        """The calls each ``<tool>:<key>`` received, in the order they arrived."""
        arrivals = []
        for member, arrival in self.client.hgetall(self.key("arrivals", thread_id)).items():
            n, token, group = (int(part) for part in arrival.split())
            arrivals.append((n, member.rsplit("|", 1)[0], Arrival(token, group)))
        by_name: dict[str, list[Arrival]] = {}
        for _, name, call in sorted(arrivals):
            by_name.setdefault(name, []).append(call)
        return by_name

    def invocations(self, thread_id: str) -> dict[str, int]:
        """How many times each ``<tool>:<key>`` really ran."""
        return {name: len(calls) for name, calls in self.arrivals(thread_id).items()}

    def applied(self, thread_id: str, tool: str, key: str) -> Any:
        value = self.client.hget(self.key("effects", thread_id), f"{tool}:{key}")
        return None if value is None else json.loads(value)

    def arm_pause(self, thread_id: str, point: str) -> None:
        """Make the first worker that reaches ``point`` for this thread wait there until
        :meth:`release_pause`, so a test can freeze it at that moment."""
        self.client.set(self.key("pause", thread_id), point)

    def release_pause(self, thread_id: str) -> None:
        self.client.rpush(self.key("go", thread_id), 1)

    def armed(self, thread_id: str, point: str) -> bool:
        return bool(self.client.get(self.key("pause", thread_id)) == point)

    def pause_point(self, thread_id: str, point: str) -> None:
        """Wait at ``point`` if this is the first worker there; call only where
        :meth:`armed` said the point is armed."""
        if not self.client.set(self.key("fired", thread_id, point), 1, nx=True):
            return
        self.client.set(self.key("reached", thread_id, point), time.time())
        self.client.blpop([self.key("go", thread_id)], timeout=300)


def _latency(seconds: float) -> None:
    """A model provider or a downstream API taking ``seconds`` to answer: simulated network
    time inside the fake services, not synchronisation."""
    if seconds > 0:
        time.sleep(seconds)


def chaos_tools(ledger: ChaosLedger, thread_id: str, latency: float) -> tuple[Any, Any]:
    """``refund``: the payment API deduplicates by idempotency key, so the tool declares
    itself idempotent. ``notify``: an email, not deduplicated downstream, so it declares a
    ``reconcile`` that asks the mail log whether it went out. Both apply their effect, then
    take ``latency`` to answer: a worker killed then leaves the claim pending."""
    # Asked here, before any call, not inside notify: a round trip there would widen the
    # window between agentq's last lease check and the email leaving, which a frozen
    # worker can slip through (the known limit of test_zombie_effect.py).
    pause_in_notify = ledger.armed(thread_id, "notify")

    @agentq.tool(idempotent=True)
    def refund(amount: int, *, idempotency_key: str, fencing_token: int) -> dict[str, Any]:
        ledger.apply(thread_id, "refund", idempotency_key, amount, fencing_token)
        _latency(latency)
        # Nothing of the key: it is the thread's, and results must match the reference's.
        return {"refunded": amount}

    @agentq.tool(reconcile=_mail_log(ledger, thread_id))
    def notify(to: str, *, idempotency_key: str, fencing_token: int) -> dict[str, Any]:
        if pause_in_notify:
            ledger.pause_point(thread_id, "notify")
        ledger.apply(thread_id, "notify", idempotency_key, to, fencing_token)
        _latency(latency)
        return {"sent_to": to}

    return refund, notify


def async_chaos_tools(ledger: ChaosLedger, thread_id: str, latency: float) -> tuple[Any, Any]:
    """:func:`chaos_tools` as ``async def`` tools, waiting as an async client does; the
    ledger's blocking calls go off the loop, as a sync client's must."""

    @agentq.tool(idempotent=True)
    async def refund(amount: int, *, idempotency_key: str, fencing_token: int) -> dict[str, Any]:
        await asyncio.to_thread(
            ledger.apply, thread_id, "refund", idempotency_key, amount, fencing_token
        )
        await asyncio.sleep(latency)
        return {"refunded": amount}

    @agentq.tool(reconcile=_mail_log(ledger, thread_id))
    async def notify(to: str, *, idempotency_key: str, fencing_token: int) -> dict[str, Any]:
        await asyncio.to_thread(
            ledger.apply, thread_id, "notify", idempotency_key, to, fencing_token
        )
        await asyncio.sleep(latency)
        return {"sent_to": to}

    return refund, notify


def _mail_log(ledger: ChaosLedger, thread_id: str) -> Any:
    """``notify``'s reconcile: whether the email with this key went out."""

    def sent(key: str, to: str) -> Any:
        if ledger.applied(thread_id, "notify", key) is None:
            return DID_NOT_RUN
        return {"sent_to": to}

    return sent


class ChaosAgent(AgentTask):
    """A support agent of ``2 * rounds + 2`` steps for chaos runs: ``start``, then per
    round a model step deciding a refund and an email and a tools step making both calls
    under idempotency claims, then a final model step. Model steps take ``latency``
    seconds, tool calls half of it each. Deterministic: the result (with a digest of the
    whole conversation) is the same however often the run was interrupted. The messages
    are an append-only field, so crashes also meet its per-thread log."""

    name = "tests.chaos_agent"
    append_only = ("messages",)
    # Its model and tools are the ledger, on the server the chaos restarts: their outage
    # is retried as an agent lists its provider's, the store's own is given back.
    retry_on = (redis.ConnectionError, redis.TimeoutError)

    def start(self, run: Run, rounds: int, latency: float = 0.0) -> str:
        self._ledger().record_start(run.thread_id, run.step, run.node)
        run.state["messages"] = [{"role": "user", "content": f"{rounds} refunds, please"}]
        run.state["plan"] = {"rounds": rounds, "latency": latency}
        return "model"

    def model(self, run: Run) -> Any:
        self._model_called(run)
        _latency(run.state["plan"]["latency"])
        return self._reply(run)

    def _model_called(self, run: Run) -> None:
        ledger = self._ledger()
        ledger.record_start(run.thread_id, run.step, run.node)
        ledger.client.incr(ledger.key("model", run.thread_id))

    def _reply(self, run: Run) -> Any:
        """The model's answer: the next round's two tool calls, or the result."""
        plan = run.state["plan"]
        done = sum(1 for m in run.state["messages"] if m["role"] == "tool") // 2
        if done < plan["rounds"]:
            n = done + 1
            reply = {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": f"call-refund-{n}", "name": "refund", "args": {"amount": 10 * n}},
                    {"id": f"call-notify-{n}", "name": "notify", "args": {"to": f"c{n}@ex.com"}},
                ],
            }
            run.state["messages"].append(reply)
            run.pending = reply["tool_calls"]
            return "tools"
        run.state["messages"].append({"role": "assistant", "content": "All done."})
        digest = hashlib.sha256(
            json.dumps(run.state["messages"], sort_keys=True).encode()
        ).hexdigest()
        return Done(
            {
                "refunded": sum(10 * (i + 1) for i in range(done)),
                "rounds": done,
                "steps": run.step + 1,
                "digest": digest,
            }
        )

    def tools(self, run: Run) -> str:
        ledger = self._ledger()
        ledger.record_start(run.thread_id, run.step, run.node)
        tools = dict(
            zip(
                ("refund", "notify"),
                chaos_tools(ledger, run.thread_id, run.state["plan"]["latency"] / 2),
                strict=True,
            )
        )
        for call in run.pending:
            result = run.tool(tools[call["name"]], key=call["id"], **call["args"])
            run.state["messages"].append({"role": "tool", "content": result})
        run.pending = []
        return "model"

    _ledgers: ClassVar[dict[int, ChaosLedger]] = {}

    def _ledger(self) -> ChaosLedger:
        """One ledger (one connection pool) per process."""
        ledger = self._ledgers.get(os.getpid())
        if ledger is None:
            conf = self.app.conf
            ledger = self._ledgers[os.getpid()] = ChaosLedger(
                conf.test_ledger_url, conf.test_ledger_ns
            )
        return ledger


class AsyncChaosAgent(ChaosAgent):
    """:class:`ChaosAgent` with ``async def`` model and tools nodes, as an agent on an async
    client has: they run on the worker's event loop, their tools under ``run.atool``."""

    name = "tests.async_chaos_agent"

    async def model(self, run: Run) -> Any:
        await asyncio.to_thread(self._model_called, run)
        await asyncio.sleep(run.state["plan"]["latency"])
        return self._reply(run)

    async def tools(self, run: Run) -> str:
        ledger = self._ledger()
        await asyncio.to_thread(ledger.record_start, run.thread_id, run.step, run.node)
        latency = run.state["plan"]["latency"] / 2
        tools = dict(
            zip(
                ("refund", "notify"), async_chaos_tools(ledger, run.thread_id, latency), strict=True
            )
        )
        for call in run.pending:
            result = await run.atool(tools[call["name"]], key=call["id"], **call["args"])
            run.state["messages"].append({"role": "tool", "content": result})
        run.pending = []
        return "model"


class ReportAgent(AgentTask):
    """Keeps a large generated document out of its checkpoints, as an artifact."""

    name = "tests.report_agent"

    def start(self, run: Run, pages: int) -> str:
        pdf = b"%PDF-1.7\n" + b"page\n" * pages
        run.state["report"] = run.artifacts.put(pdf, content_type="application/pdf")
        return "check"

    def check(self, run: Run) -> Done:
        data = run.artifacts.get(run.state["report"])
        return Done({"size": len(data), "ref": run.state["report"]})


class WaitingAgent(AgentTask):
    """``steps`` steps that each block ``wait`` seconds, as a model call would; the state
    keeps when each step ran, so a test can see threads overlap."""

    name = "tests.waiting_agent"

    def start(self, run: Run, steps: int, wait: float) -> str:
        run.state.update(left=steps, wait=wait, spans=[])
        return "think"

    def think(self, run: Run) -> Any:
        began = time.time()
        time.sleep(run.state["wait"])  # the model call
        run.state["spans"].append([began, time.time()])
        run.state["left"] -= 1
        return "think" if run.state["left"] else Done(len(run.state["spans"]))


class GatedAgent(AgentTask):
    """One node that says in the ledger when it starts (``entered``), waits for the test's
    ``go`` and says when it ends (``leaving``): the commit after it follows at once."""

    name = "tests.gated_agent"

    def start(self, run: Run) -> Done:
        ledger = ledger_of(self)
        ledger.client.set(ledger.key("entered", run.thread_id), 1)
        assert ledger.client.blpop([ledger.key("go", run.thread_id)], timeout=60)
        ledger.client.set(ledger.key("leaving", run.thread_id), 1)
        return Done("ok")


AGENTS = (
    SupportAgent,
    WaitingAgent,
    ApprovalAgent,
    NotesAgent,
    FlakyToolAgent,
    CountingAgent,
    NappingAgent,
    TracedToolAgent,
    StallingAgent,
    BrokenAgent,
    ReportAgent,
    GatedAgent,
)


def make_app(
    *, broker: str, store: str, prefix: str, queue: str, ledger_url: str, **settings: Any
) -> Celery:
    app = Celery("agentq-tests", broker=broker, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        test_ledger_url=ledger_url,
        test_ledger_ns=prefix.rstrip(":"),
    )
    agentq.init_app(app, store=store, prefix=prefix, **settings)
    for agent in AGENTS:
        app.register_task(agent())
    return app
