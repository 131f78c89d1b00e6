"""One store call at a time, failed the way a store restart fails it: reproductions of what
the chaos test can only hit by chance.

The node's store calls go through :class:`~tests.chaos.flaky_proxy.FlakyProxy` to a
private ``redis-server``; the tool's effect is counted on a direct connection. The driver
runs in this process (``task.run``): what matters here is the store, not Celery.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, TypedDict

import pytest
import redis
from celery import Celery
from celery.exceptions import Ignore
from langgraph.graph import END, START, StateGraph

import agentq
from agentq import AgentTask, Done, Run, Status
from agentq.celery.recovery import Sweeper
from agentq.errors import LeaseHeld, ThreadExists, ThreadStopped
from agentq.langgraph import graph_task
from agentq.records import Checkpoint
from agentq.store.contract import Taken
from agentq.store.graph_records import StoredCheckpoint, encode_refs
from agentq.store.redis.store import RedisStore
from tests.chaos.flaky_proxy import FlakyProxy
from tests.support.redis_server import RedisServer, wait_until

pytestmark = pytest.mark.chaos


class Mailer(AgentTask):
    """One step: sends one email through a tool that declares no policy (not idempotent,
    nothing to reconcile with), the case where agentq must never guess."""

    name = "tests.chaos.mailer"
    outbox: redis.Redis | None = None

    def start(self, run: Run) -> Any:
        return Done(run.tool(self.send_email, "a@example.com", key="email-1"))

    def send_email(self, to: str) -> dict[str, str]:
        assert self.outbox is not None
        self.outbox.incr("emails")
        return {"sent": to}


class Env:
    def __init__(self, server: RedisServer, proxy: FlakyProxy) -> None:
        self.proxy = proxy
        self.outbox = redis.Redis(port=server.port, decode_responses=True)
        self.store = RedisStore(redis.Redis(port=proxy.port), prefix="faults:")
        for script in self.store._scripts.values():  # a NOSCRIPT reply is not the point
            self.outbox.script_load(script.script)
        self.app = Celery("faults", broker="memory://", set_as_current=False)
        agentq.init_app(self.app, store=self.store, lease_ttl=5)
        self.agent: Mailer = self.app.register_task(Mailer())
        self.agent.outbox = self.outbox

    def sha(self, script: str) -> bytes:
        return self.store._scripts[script].sha.encode()

    def emails(self) -> int:
        return int(self.outbox.get("emails") or 0)

    def close(self) -> None:
        self.store.close()
        self.outbox.close()
        self.app.close()


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    server = RedisServer(tmp_path / "store").start()
    proxy = FlakyProxy(server.port)
    environment: Env | None = None
    try:
        environment = Env(server, proxy)
        environment.store.open_thread("t1", task=Mailer.name)
        yield environment
    finally:
        if environment is not None:
            environment.close()
        proxy.close()
        server.stop()


def test_a_lost_reply_to_a_claim_is_not_taken_for_a_dead_worker(env: Env) -> None:
    env.proxy.lose_reply_to = env.sha("claim_effect")
    result = env.agent.run("t1")
    assert env.proxy.lost == 1  # the reply really was lost, and redis-py resent the claim
    meta = env.store.meta("t1")
    assert meta is not None
    assert (meta.status, env.emails()) == (Status.DONE, 1), meta.error
    assert result == {"sent": "a@example.com"}


def test_a_lost_reply_to_the_take_that_counts_the_last_lost_worker_fails_the_thread(
    env: Env,
) -> None:
    """The take redis-py resends after its reply was lost finds the lease the first one
    gave, and reports the lost worker that one counted: at ``max_crashes`` the thread
    fails rather than run the step that keeps crashing its workers once more."""
    max_crashes = env.agent.agentq.settings.max_crashes
    env.store.acquire("t1", "lost-0", 0.05)
    for n in range(1, max_crashes):  # the workers lost before this one, each counted
        taken = wait_until(partial(_take, env.store, f"lost-{n}"), timeout=5, what="expiry")
        assert taken.meta.crashes == n
    lock = env.store.keys.lock("t1")
    wait_until(lambda: not env.outbox.exists(lock), timeout=5, what="expiry")
    env.proxy.lose_reply_to = env.sha("acquire")
    with pytest.raises(ThreadStopped, match=f"worker lost {max_crashes} times"):
        env.agent.run("t1")
    assert env.proxy.lost == 1
    meta = env.store.meta("t1")
    assert meta is not None
    assert (meta.status, meta.crashes, env.emails()) == (Status.FAILED, max_crashes, 0)


def _take(store: RedisStore, owner: str) -> Taken | None:
    try:
        return store.acquire_to_run("t1", owner, 0.05)
    except LeaseHeld:
        return None


def test_a_store_outage_inside_a_tool_call_leaves_the_thread_to_recovery(env: Env) -> None:
    env.proxy.drop = env.sha("complete_effect")  # the store is unreachable for this call only
    with pytest.raises(Ignore):  # HANDED_OVER, not the store's ConnectionError
        env.agent.run("t1")
    assert env.proxy.dropped >= 2  # redis-py retried before giving up
    assert env.emails() == 1
    meta = env.store.meta("t1")
    assert meta is not None
    # Given back to the queue once the store answered again (or left to its lease's
    # expiry, or scheduled for a retry): not given up on, no crash counted.
    assert meta.status in (Status.QUEUED, Status.RUNNING, Status.RETRYING), (
        f"{meta.status.value}: {meta.error}"
    )
    assert meta.crashes == 0


def test_a_lease_confirmation_answered_too_late_stops_the_tool_call(env: Env) -> None:
    # The reply to the renewal right before the call arrives after the lease would have run
    # out, as to a worker frozen between sending it and reading it: another worker may
    # have taken the thread over and sent the email itself by then.
    env.proxy.delay_reply_to, env.proxy.reply_delay = env.sha("renew"), 5.5
    with pytest.raises(Ignore):  # stopped: "another worker drives it now", HANDED_OVER
        env.agent.run("t1")
    assert env.emails() == 0
    # The call never started, so its claim is dropped rather than left to say it may have
    # run; fenced, the drop would leave alone a claim of a worker that took over meanwhile.
    assert env.store.effect("t1", "email-1") is None
    assert env.agent.run("t1") == {"sent": "a@example.com"}  # the next driver sends it
    assert env.emails() == 1


class Counter(TypedDict):
    n: int


def test_a_store_outage_in_a_graph_checkpoint_write_gives_the_thread_back(env: Env) -> None:
    """The LangGraph saver's writes are agentq's store calls too: failing for good, they
    give the thread back (queued, no attempt or crash counted), not fail it."""
    graph = StateGraph(Counter)
    graph.add_node("step", lambda state: {"n": state["n"] + 1})
    graph.add_edge(START, "step")
    graph.add_edge("step", END)
    task = graph_task(env.app, graph, name="tests.chaos.counter_graph")
    env.store.open_thread("t2", task=task.name, input={"input": task._pack({"n": 0})})
    env.proxy.drop = env.store.graph()._scripts["put"].sha.encode()  # type: ignore[attr-defined]
    with pytest.raises(Ignore):  # HANDED_OVER, not the store's ConnectionError
        task.run("t2")
    assert env.proxy.dropped >= 1
    meta = env.store.meta("t2")
    assert meta is not None
    assert (meta.status, meta.attempts, meta.crashes) == (Status.QUEUED, 0, 0), meta.error


def _stopped_on_a_claim(store: RedisStore) -> int:
    """t1 stopped in needs_attention on ``email-1``, claimed by a worker that died."""
    token = store.acquire("t1", "w1", 30)
    store.claim_effect("t1", "email-1", token, claim_id="c1")
    store.set_status("t1", token, Status.NEEDS_ATTENTION, error="unknown", release_owner="w1")
    return token


def test_a_reopen_resent_after_its_reply_was_lost_reports_what_it_did(env: Env) -> None:
    """redis-py resends the reopen, which finds the thread queued already: the resend
    answers as the reopen did, not with "the thread is not failed"."""
    _stopped_on_a_claim(env.store)
    env.proxy.lose_reply_to = env.sha("reopen")
    meta = env.store.reopen("t1", from_statuses={Status.NEEDS_ATTENTION}, start_grace=0)
    assert env.proxy.lost == 1
    assert meta.status == Status.QUEUED
    assert env.store.meta("t1") == meta


def test_a_resolve_resent_after_its_reply_was_lost_reports_what_it_did(env: Env) -> None:
    token = _stopped_on_a_claim(env.store)
    env.proxy.lose_reply_to = env.sha("resolve_effect")
    meta = env.store.resolve_effect("t1", "email-1", result={"sent": "a@example.com"})
    assert env.proxy.lost == 1
    assert (meta.status, meta.fence) == (Status.QUEUED, token + 1)  # settled once
    effect = env.store.effect("t1", "email-1")
    assert effect is not None and effect.result == {"sent": "a@example.com"}
    assert env.agent.run("t1") == {"sent": "a@example.com"}
    assert env.emails() == 0


def test_a_fork_resent_after_its_reply_was_lost_reports_the_fork(env: Env) -> None:
    token = env.store.acquire("t1", "w1", 30)
    env.store.commit("t1", token, Checkpoint(step=0, node="start", token=token, task=Mailer.name))
    env.proxy.lose_reply_to = env.sha("create_fork")
    meta = env.store.fork("t1", 0, "t1-fork")
    assert env.proxy.lost == 1
    assert (meta.thread_id, meta.status, meta.step) == ("t1-fork", Status.WAITING, 0)
    with pytest.raises(ThreadExists):  # a fork of its own into the same id is still refused
        env.store.fork("t1", 0, "t1-fork")


def test_a_park_resent_after_its_reply_was_lost_reports_the_place(env: Env) -> None:
    """The thread's entry into a full concurrency key parked it (queued, its lease given
    up); the resend finds it parked, and answers with its place rather than "the thread
    is not running", which would fail its task."""
    seated = env.store.acquire("t1", "w1", 30)
    assert env.store.enter_key("t1", "w1", seated, "tenant-a", 1) == 0
    env.store.open_thread("t2", task=Mailer.name)
    token = env.store.acquire("t2", "w2", 30)
    env.proxy.lose_reply_to = env.store._key_scripts["enter_key"].sha.encode()
    assert env.store.enter_key("t2", "w2", token, "tenant-a", 1) == 1
    assert env.proxy.lost == 1
    meta = env.store.meta("t2")
    assert meta is not None and meta.status == Status.QUEUED
    assert env.store.leave_key("t1", seated, "tenant-a", start_grace=0) == ["t2"]


def test_a_delete_resent_after_its_reply_was_lost_leaves_the_thread_out_of_langgraph_lists(
    env: Env,
) -> None:
    """The resend finds the thread gone; the LangGraph thread index, which its first run
    could not clean (the reply never came), must not keep listing it."""
    token = env.store.acquire("t1", "w1", 30)
    graph = env.store.graph()
    stored = StoredCheckpoint(
        checkpoint_id="c1",
        record=b"record",
        refs=encode_refs([b"ch"]),
        run_id=None,
        blobs={b"ch": b"v"},
    )
    graph.put("t1", "", stored, token)
    assert graph.threads() == ["t1"]
    env.proxy.lose_reply_to = env.sha("delete_thread")
    env.store.delete_thread("t1")
    assert env.proxy.lost == 1
    assert graph.threads() == []


def test_a_claim_of_due_threads_resent_after_its_reply_was_lost_still_sends_them(
    env: Env,
) -> None:
    """The claim pushed the due threads a start grace ahead before its reply was lost; the
    resend must answer with the threads the first run took, or none of them is sent
    before that grace runs out (30 s by default), past the lease TTL plus one sweep that
    recovery promises."""
    env.store.open_thread("t2", task=Mailer.name, start_grace=0)
    env.proxy.lose_reply_to = env.sha("claim_due")
    assert Sweeper(env.app).sweep_once() == ["t2"]
    assert env.proxy.lost == 1


def test_a_sweep_broken_off_by_one_thread_leaves_the_threads_after_it_due(env: Env) -> None:
    """The store fails (for longer than redis-py's retries) while the sweeper reads one of
    the threads it claimed: the threads it claimed after that one must be sent by the next
    sweep, not a start grace later."""
    env.store.open_thread("t2", task=Mailer.name, start_grace=0)
    env.store.open_thread("t3", task=Mailer.name, start_grace=0)
    sweeper = Sweeper(env.app)
    env.proxy.drop = env.store.keys.meta("t2").encode()
    with pytest.raises(redis.ConnectionError):
        sweeper.sweep_once()
    assert env.proxy.dropped >= 1
    env.proxy.drop = None
    assert sweeper.sweep_once() == ["t3"]  # t2, the one that broke the sweep, waits its hold
