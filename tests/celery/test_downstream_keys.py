"""The idempotency key a tool forwards downstream, on an in-process worker: a payment
service that deduplicates by that key must see one key per thread and effect, never a
key another thread, a fork or another deployment also sends."""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

import agentq
from agentq import Done, FunctionAgent, Run, Status
from agentq.store.redis.store import RedisStore
from tests.support.redis_server import RedisServer, wait_until


@dataclass
class PaymentService:
    """Deduplicates by idempotency key across all its clients, as payment APIs do: a
    request with a key it has seen gets the first request's outcome back."""

    charges: dict[str, tuple[str, int]] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def refund(self, order: str, cents: int, *, idempotency_key: str) -> dict[str, Any]:
        with self.lock:
            self.keys.append(idempotency_key)
            order, cents = self.charges.setdefault(idempotency_key, (order, cents))
        return {"order": order, "cents": cents}


@dataclass
class Env:
    app: Celery
    agent: FunctionAgent
    service: PaymentService
    store: RedisStore


@pytest.fixture
def env(redis_broker: str, redis_server: RedisServer) -> Iterator[Env]:
    prefix = f"dk{uuid.uuid4().hex[:8]}:"
    app = Celery("agentq-downstream-keys", broker=redis_broker, set_as_current=False)
    app.conf.update(
        task_default_queue=f"agentq-test-{prefix}",
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    agentq.init_app(app, store=redis_server.url, prefix=prefix, lease_ttl=5, start_grace=5)
    service = PaymentService()
    agent = agentq.agent(app, "tests.downstream_refunds")

    @agent.node
    def start(run: Run, order: str, cents: int, key: str | None = None) -> str:
        run.state.update(order=order, cents=cents, key=key)
        return "approve"

    @agent.node
    def approve(run: Run) -> str:
        # A person confirms; a fork made here sends its own refund.
        run.state["cents"] = run.interrupt({"confirm": run.state["cents"]})
        return "pay"

    @agent.node
    def pay(run: Run) -> Done:
        state = run.state
        return Done(run.tool(service.refund, state["order"], state["cents"], key=state["key"]))

    with start_worker(
        app, pool="threads", concurrency=2, perform_ping_check=False, shutdown_timeout=30
    ):
        yield Env(app, agent, service, app._agentq_runtime.store)
    app._agentq_runtime.store.close()
    app.close()


def waiting_for_confirmation(env: Env, thread_id: str) -> None:
    wait_until(
        lambda: env.agent.thread(thread_id).status == Status.WAITING,
        timeout=30,
        what=f"{thread_id} waiting for its confirmation",
    )


def refund(env: Env, thread_id: str, order: str, cents: int, key: str | None = None) -> Any:
    env.agent.delay(thread_id, order=order, cents=cents, key=key)
    waiting_for_confirmation(env, thread_id)
    env.agent.resume(thread_id, cents)
    return env.agent.wait(thread_id, timeout=30)


@pytest.mark.parametrize("key", [None, "call_0"], ids=["default-key", "model-call-id"])
def test_two_threads_never_send_the_same_key(env: Env, key: str | None) -> None:
    assert refund(env, "t1", "#1", 10, key) == {"order": "#1", "cents": 10}
    assert refund(env, "t2", "#2", 99, key) == {"order": "#2", "cents": 99}
    assert len(env.service.charges) == 2
    first, second = env.service.keys
    assert first != second
    for sent in env.service.keys:
        assert re.fullmatch(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", sent)
    effect_key = key or "step2.call1"
    assert first == env.store.downstream_key("t1", effect_key)


def test_a_fork_sends_its_own_keys_after_the_fork_point(env: Env) -> None:
    assert refund(env, "src", "#3", 30) == {"order": "#3", "cents": 30}
    # Fork where the source waited for its confirmation, and confirm another amount.
    (before_approval,) = [c.step for c in env.store.history("src") if c.node == "approve"]
    env.store.fork("src", before_approval, "src-fork")
    env.agent.resume("src-fork", 31)
    assert env.agent.wait("src-fork", timeout=30) == {"order": "#3", "cents": 31}
    assert env.agent.thread("src-fork").status == Status.DONE
    assert sorted(env.service.charges.values()) == [("#3", 30), ("#3", 31)]


def test_a_thread_id_used_again_after_its_thread_was_deleted_sends_new_keys(env: Env) -> None:
    """What ``agentq gc`` does to a finished thread, then a new conversation under the
    same id: the service must not hand it the first refund back."""
    assert refund(env, "cust-7", "#1", 10) == {"order": "#1", "cents": 10}
    assert env.store.delete_thread("cust-7")
    assert refund(env, "cust-7", "#2", 99) == {"order": "#2", "cents": 99}
    assert sorted(env.service.charges.values()) == [("#1", 10), ("#2", 99)]


def test_two_deployments_on_the_same_prefix_never_send_the_same_key(
    env: Env, redis_server: RedisServer
) -> None:
    """Staging and production, each on its own Redis database with the default prefix:
    the same thread id and effect key are two refunds to a service both call."""
    database = redis_server.url.rsplit("/", 1)[0] + "/7"
    with RedisStore.from_url(database, prefix=env.store.keys.prefix) as staging:
        env.store.open_thread("t1", task="agent")
        staging.open_thread("t1", task="agent")
        assert staging.key_namespace == env.store.key_namespace
        assert staging.downstream_key("t1", "k") != env.store.downstream_key("t1", "k")
        staging.delete_thread("t1")


def test_shared_keys_depend_on_the_prefix_and_the_key_alone(
    env: Env, redis_server: RedisServer
) -> None:
    with RedisStore.from_url(redis_server.url, prefix="staging:") as staging:
        assert staging.downstream_key("t1", "k", shared=True) != env.store.downstream_key(
            "t1", "k", shared=True
        )
    for thread_id in ("t1", "t2", "a", "a|b"):
        env.store.open_thread(thread_id, task="agent")
    shared = env.store.downstream_key("t1", "invoice-7", shared=True)
    assert shared == env.store.downstream_key("t2", "invoice-7", shared=True)
    assert shared != env.store.downstream_key("t1", "invoice-7")
    # A thread id that ends the way another begins cannot forge its key.
    assert env.store.downstream_key("a", "b|c") != env.store.downstream_key("a|b", "c")
