"""AgentTask logic on an in-process Celery worker (Redis broker, private Redis store)."""

from __future__ import annotations

import contextlib
import datetime
import re
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from click.testing import CliRunner, Result

from agentq import Status
from agentq.cli import cli
from agentq.codec.envelope import decode_envelope
from agentq.errors import (
    ArtifactNotFound,
    InvalidArgument,
    InvalidThreadId,
    ThreadStopped,
    UnserializableState,
)
from agentq.records import Checkpoint
from agentq.store.contract import Store
from agentq.store.redis.store import RedisStore
from tests.support.agents import Ledger, make_app
from tests.support.redis_server import RedisServer, wait_until


class Env:
    def __init__(self, app: Celery, ledger: Ledger) -> None:
        self.app = app
        self.ledger = ledger
        self.store: Store = app._agentq_runtime.store

    def agent(self, name: str) -> Any:
        return self.app.tasks[f"tests.{name}"]


@contextlib.contextmanager
def running(
    broker: str, redis_server: RedisServer, *, queues: list[str] | None = None
) -> Iterator[Env]:
    """An app on a private prefix and an in-process worker consuming ``queues`` (by
    default the app's own default queue)."""
    prefix = f"at{uuid.uuid4().hex[:8]}:"
    app = make_app(
        broker=broker,
        store=redis_server.url,
        prefix=prefix,
        queue=f"agentq-test-{prefix}",
        ledger_url=redis_server.url,
        lease_ttl=3,
        sweep_interval=0.2,
        start_grace=5,
        backoff_base=0.1,
    )
    ledger = Ledger(redis_server.url, prefix.rstrip(":"), app._agentq_runtime.store)
    with start_worker(
        app,
        pool="threads",
        concurrency=2,
        perform_ping_check=False,
        shutdown_timeout=30,
        queues=queues,
    ):
        yield Env(app, ledger)
    ledger.client.close()
    app._agentq_runtime.store.close()
    app.close()


@pytest.fixture
def env(redis_broker: str, redis_server: RedisServer) -> Iterator[Env]:
    with running(redis_broker, redis_server) as env:
        yield env


@pytest.fixture
def routed_env(redis_broker: str, redis_server: RedisServer) -> Iterator[tuple[Env, str]]:
    """A worker that consumes only a queue of its own, not the app's default queue."""
    queue = f"agentq-test-routed-{uuid.uuid4().hex[:8]}"
    with running(redis_broker, redis_server, queues=[queue]) as env:
        yield env, queue


def test_a_thread_keeps_its_queue_for_every_later_send(
    routed_env: tuple[Env, str],
) -> None:
    env, queue = routed_env
    support, approval = env.agent("support_agent"), env.agent("approval_agent")
    # The retry is re-sent by the sweeper; nobody consumes the default queue.
    support.apply_async(
        ("t1",), {"question": "hi", "refunds": 0, "rate_limits": 1, "retry_after": 0}, queue=queue
    )
    assert support.wait("t1", timeout=30) == "Refunded 0 EUR."
    assert support.thread("t1").options == {"queue": queue}
    approval.apply_async(("t2",), {"amount": 5}, queue=queue)
    wait_until(lambda: approval.thread("t2").status == Status.WAITING, timeout=10, what="waiting")
    approval.resume("t2", {"approved": True})
    wait_until(
        lambda: approval.thread("t2").interrupt == {"question": "anything else?"},
        timeout=10,
        what="second interrupt",
    )
    approval.resume("t2", "thanks")
    assert approval.wait("t2", timeout=10) == {"approved": True, "note": "thanks"}


def test_delay_of_an_existing_thread_sends_it_to_its_own_queue(
    routed_env: tuple[Env, str], redis_broker: str
) -> None:
    env, queue = routed_env
    agent = env.agent("counting_agent")
    agent.apply_async(("t1",), {"n": 2}, queue=queue)
    assert agent.wait("t1", timeout=30) == 2
    agent.delay("t1")  # as a caller that does not know the thread's queue sends it again
    with redis.Redis.from_url(redis_broker) as broker:
        assert broker.llen(env.app.conf.task_default_queue) == 0  # nobody would consume it


@pytest.mark.parametrize("form", ["aware", "naive UTC", "ISO 8601"])
def test_an_eta_keeps_recovery_off_the_thread_until_then(env: Env, form: str) -> None:
    """The message waits in the worker until its ``eta``: the thread is not due before it,
    or the sweeper would send it at once without one."""
    agent = env.agent("counting_agent")
    eta = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
    given = {"aware": eta, "naive UTC": eta.replace(tzinfo=None), "ISO 8601": eta.isoformat()}
    agent.apply_async(("t1",), {"n": 2}, eta=given[form])
    agent.apply_async(("t2",), {"n": 2}, countdown=3600)
    by_eta, by_countdown = (s.due_at for s in env.store.schedules(["t1", "t2"]))
    assert by_eta is not None and by_countdown is not None
    assert by_eta >= eta.timestamp()
    assert abs(by_eta - by_countdown) < 60  # the same hour as a countdown says
    assert agent.thread("t1").status == Status.QUEUED


def test_a_thread_runs_to_done_with_one_checkpoint_per_node(env: Env) -> None:
    agent = env.agent("support_agent")
    agent.delay("t1", question="refund my order", refunds=2)
    assert agent.wait("t1", timeout=30) == "Refunded 20 EUR."
    meta = agent.thread("t1")
    # start, model, tools, model, tools, model
    assert (meta.status, meta.step) == (Status.DONE, 5)
    assert [c.node for c in env.store.history("t1")] == [
        None,
        "model",
        "tools",
        "model",
        "tools",
        "model",
    ]
    assert env.ledger.model_calls("t1") == 3
    assert env.ledger.tool_calls("t1") == env.ledger.as_sent(
        "t1", {"call-refund-1": 1, "call-refund-2": 1}
    )


def test_a_thread_queued_at_its_final_checkpoint_is_done_at_once(env: Env) -> None:
    # What a fork of a finished step was before forks of one were refused.
    agent, store = env.agent("counting_agent"), env.store
    store.open_thread("t1", task=agent.name, start_grace=3600)
    token = store.acquire("t1", "old-worker", 30)
    store.commit("t1", token, Checkpoint(step=0, node=None, task=agent.name, token=token))
    store.set_status("t1", token, Status.QUEUED, due_in=0, release_owner="old-worker")
    agent.enqueue("t1")
    assert agent.wait("t1", timeout=20) is None
    meta = agent.thread("t1")
    assert (meta.status, meta.crashes) == (Status.DONE, 0)
    # The lease was given up with the status: another owner takes it at once.
    store.release("t1", "someone", store.acquire("t1", "someone", 30))


def test_sending_a_thread_again_never_runs_it_twice(env: Env) -> None:
    agent = env.agent("counting_agent")
    agent.delay("t1", n=3, slow=0.3)
    wait_until(
        lambda: env.ledger.client.get(env.ledger.key("steps", "t1")), timeout=10, what="first step"
    )
    agent.delay("t1", n=99)  # while running: left to its driver, first input kept
    assert agent.wait("t1", timeout=30) == 3
    agent.delay("t1", n=99)  # after done: returns the result, runs nothing
    agent.delay("t1")
    assert agent.wait("t1", timeout=5) == 3
    assert int(env.ledger.client.get(env.ledger.key("steps", "t1"))) == 3


def test_a_step_longer_than_the_lease_keeps_it_by_heartbeats(env: Env) -> None:
    agent = env.agent("counting_agent")
    agent.delay("t1", n=1, slow=4.5)  # one blocking step of 1.5 x lease_ttl (3 s)
    assert agent.wait("t1", timeout=30) == 1
    meta = agent.thread("t1")
    # No second driver took the thread over (it would have taken fence 2 and run the
    # step again) while the sweeper looked every 0.2 s.
    assert (meta.fence, meta.crashes) == (1, 0)
    assert int(env.ledger.client.get(env.ledger.key("steps", "t1"))) == 1


def test_rate_limit_waits_for_retry_after_then_finishes(env: Env) -> None:
    agent = env.agent("support_agent")
    agent.delay("t1", question="hi", refunds=0, rate_limits=1, retry_after=2)
    wait_until(
        lambda: agent.thread("t1").status == Status.RETRYING, timeout=10, what="retrying status"
    )
    assert agent.thread("t1").attempts == 1
    agent.delay("t1")  # sent again during the wait: it must not cut the wait short
    assert agent.wait("t1", timeout=30) == "Refunded 0 EUR."
    times = [float(t) for t in env.ledger.client.lrange(env.ledger.key("model-times", "t1"), 0, -1)]
    assert len(times) == 2 and times[1] - times[0] >= 2.0


def test_the_error_of_a_rate_limit_is_gone_once_the_thread_moves_on(env: Env) -> None:
    agent = env.agent("support_agent")
    agent.delay("t1", question="hi", refunds=1, rate_limits=1, retry_after=0)
    assert agent.wait("t1", timeout=30) == "Refunded 10 EUR."
    meta = agent.thread("t1")
    assert env.ledger.model_calls("t1") == 3  # the 429, then two answers
    assert (meta.status, meta.attempts, meta.error) == (Status.DONE, 0, None)


def test_rate_limit_past_max_attempts_fails_the_thread(env: Env) -> None:
    agent = env.agent("support_agent")
    agent.delay("t1", question="hi", refunds=0, rate_limits=99, retry_after=0)
    with pytest.raises(ThreadStopped) as info:
        agent.wait("t1", timeout=30)
    meta = agent.thread("t1")
    assert meta.status == Status.FAILED and meta.attempts == 5
    assert "gave up after 5 attempts" in (meta.error or "") and "429" in (meta.error or "")
    assert env.ledger.model_calls("t1") == 5
    assert info.value.status == "failed"


def test_interrupt_waits_for_a_human_and_resumes_with_the_value(env: Env) -> None:
    agent = env.agent("approval_agent")
    agent.delay("t1", amount=30)
    wait_until(lambda: agent.thread("t1").status == Status.WAITING, timeout=10, what="waiting")
    assert agent.thread("t1").interrupt == {"question": "refund 30?"}
    with pytest.raises(ThreadStopped):
        agent.wait("t1", timeout=1)
    agent.resume("t1", {"approved": True})
    wait_until(
        lambda: agent.thread("t1").interrupt == {"question": "anything else?"},
        timeout=10,
        what="second interrupt",
    )
    agent.resume("t1", "no, thanks")
    assert agent.wait("t1", timeout=10) == {"approved": True, "note": "no, thanks"}


def test_cancel_stops_a_running_thread_at_the_next_step(env: Env) -> None:
    agent = env.agent("counting_agent")
    agent.delay("t1", n=50, slow=0.2)
    wait_until(lambda: agent.thread("t1").step >= 1, timeout=10, what="a committed step")
    assert agent.cancel("t1") == Status.RUNNING
    wait_until(lambda: agent.thread("t1").status == Status.CANCELLED, timeout=10, what="cancelled")
    steps = agent.thread("t1").step
    assert steps < 50 and env.store.latest("t1").step == steps  # type: ignore[union-attr]


def test_a_failing_step_fails_the_thread_and_retry_thread_resumes_it(env: Env) -> None:
    agent = env.agent("broken_agent")
    agent.delay("t1", mode="bug")
    with pytest.raises(ThreadStopped) as info:
        agent.wait("t1", timeout=10)
    assert info.value.status == "failed"
    assert "KeyError" in (info.value.error or "") and "Traceback" in (info.value.error or "")
    assert agent.thread("t1").step == 0  # the checkpoint before the failing node is kept
    env.ledger.client.set(env.ledger.key("fixed", "t1"), 1)
    agent.retry_thread("t1")
    assert agent.wait("t1", timeout=10) == "fixed"


def test_unstorable_state_fails_the_thread_naming_the_path(env: Env) -> None:
    agent = env.agent("broken_agent")
    agent.delay("t1", mode="unstorable")
    with pytest.raises(ThreadStopped) as info:
        agent.wait("t1", timeout=10)
    assert "state.handle" in (info.value.error or "")
    assert env.store.latest("t1").step == 0  # type: ignore[union-attr]


# Celery's Redis result backend still calls redis-py's deprecated setex.
@pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")
@pytest.mark.parametrize("serializer", ["json", "pickle"])
def test_get_raises_unserializable_state_from_the_worker(
    redis_broker: str, result_backend: str, redis_server: RedisServer, serializer: str
) -> None:
    prefix = f"us{uuid.uuid4().hex[:8]}:"
    app = make_app(
        broker=redis_broker,
        store=redis_server.url,
        prefix=prefix,
        queue=f"agentq-test-{prefix}",
        ledger_url=redis_server.url,
    )
    app.conf.update(
        result_backend=result_backend,
        result_serializer=serializer,
        result_accept_content=[serializer],
        accept_content=["json", serializer],
    )
    agent = app.tasks["tests.broken_agent"]
    with start_worker(app, pool="solo", perform_ping_check=False):
        result = agent.delay("t1", mode="unstorable")
        with pytest.raises(UnserializableState, match=r"state\.handle"):
            result.get(timeout=20)
    app.close()
    error = result.result
    assert isinstance(error, UnserializableState)
    # Pickle keeps the attributes; JSON carries the message only.
    assert error.path == ("state.handle" if serializer == "pickle" else None)


def test_a_node_returning_nonsense_fails_clearly(env: Env) -> None:
    agent = env.agent("broken_agent")
    agent.delay("t1", mode="bad_return")
    with pytest.raises(ThreadStopped) as info:
        agent.wait("t1", timeout=10)
    assert "returned int" in (info.value.error or "")


def test_async_nodes_run(env: Env) -> None:
    agent = env.agent("counting_agent")
    agent.delay("t1", n=2)
    assert agent.wait("t1", timeout=10) == 2


@pytest.mark.parametrize("bad", ["", "a{b}", "x" * 300])
def test_bad_thread_ids_are_refused_before_sending(env: Env, bad: str) -> None:
    with pytest.raises(InvalidThreadId):
        env.agent("counting_agent").delay(bad, n=1)


def test_inputs_must_be_keywords(env: Env) -> None:
    with pytest.raises(InvalidArgument, match="keyword arguments"):
        env.agent("counting_agent").delay("t1", 3)


def _claim_as_dead_worker(store: Store, thread_id: str, key: str, *, shared: bool = False) -> None:
    """A driver that claimed an effect and died before recording it."""
    token = store.acquire(thread_id, "dead-worker", 30)
    store.claim_effect(thread_id, key, token, shared=shared)
    store.set_status(thread_id, token, Status.QUEUED, due_in=0, release_owner="dead-worker")


@pytest.mark.parametrize("policy,expected_calls", [("reconcile", 0), ("idempotent", 1)])
def test_unknown_outcome_is_settled_by_the_tool_policy(
    env: Env, policy: str, expected_calls: int
) -> None:
    agent = env.agent("support_agent")
    env.store.open_thread(
        "t1", task=agent.name, start_grace=3600, input={"question": "hi", "policy": policy}
    )
    _claim_as_dead_worker(env.store, "t1", "call-refund-1")
    # The dead worker's refund did reach the payment service:
    env.ledger.client.hset(
        env.ledger.key("effects", "t1"), env.ledger.sent("t1", "call-refund-1"), 10
    )
    agent.enqueue("t1")
    assert agent.wait("t1", timeout=20) == "Refunded 10 EUR."
    assert (
        env.ledger.tool_calls("t1").get(env.ledger.sent("t1", "call-refund-1"), 0) == expected_calls
    )
    assert env.ledger.effects("t1") == env.ledger.as_sent("t1", {"call-refund-1": "10"})


def test_unknown_outcome_without_policy_needs_attention(env: Env) -> None:
    agent = env.agent("support_agent")
    env.store.open_thread(
        "t1", task=agent.name, start_grace=3600, input={"question": "hi", "policy": "none"}
    )
    _claim_as_dead_worker(env.store, "t1", "call-refund-1")
    agent.enqueue("t1")
    with pytest.raises(ThreadStopped) as info:
        agent.wait("t1", timeout=20)
    assert info.value.status == "needs_attention"
    assert "call-refund-1" in (info.value.error or "") and "refund" in (info.value.error or "")
    assert env.ledger.tool_calls("t1") == {}


@pytest.mark.parametrize("settled", ["result", "did_not_run"])
def test_an_operator_settles_a_needs_attention_thread_and_it_runs_on(
    env: Env, settled: str
) -> None:
    agent = env.agent("support_agent")
    env.store.open_thread(
        "t1", task=agent.name, start_grace=3600, input={"question": "hi", "policy": "none"}
    )
    _claim_as_dead_worker(env.store, "t1", "call-refund-1")
    agent.enqueue("t1")
    with pytest.raises(ThreadStopped, match="agentq resolve t1 call-refund-1 --result"):
        agent.wait("t1", timeout=20)
    [effect] = env.store.effects("t1")
    assert (effect.key, effect.state) == ("call-refund-1", "pending")
    if settled == "result":  # the operator found the refund made by the dead worker
        agent.resolve_effect("t1", "call-refund-1", result={"refund_id": "re_9", "amount": 10})
    else:
        agent.resolve_effect("t1", "call-refund-1", did_not_run=True)
    assert agent.wait("t1", timeout=20) == "Refunded 10 EUR."
    calls = {} if settled == "result" else {"call-refund-1": 1}
    assert env.ledger.tool_calls("t1") == env.ledger.as_sent("t1", calls)
    latest = env.store.latest("t1")
    assert latest is not None
    [reply] = [m["content"] for m in latest.state["messages"] if m["role"] == "tool"]
    assert reply["amount"] == 10
    assert reply["refund_id"] == (
        "re_9" if settled == "result" else f"re_{env.ledger.sent('t1', 'call-refund-1')}"
    )


@pytest.mark.parametrize("settled", ["result", "did_not_run"])
def test_an_operator_settles_a_shared_call_and_the_thread_runs_on(env: Env, settled: str) -> None:
    agent = env.agent("support_agent")
    env.store.open_thread(
        "t1", task=agent.name, start_grace=3600, input={"question": "hi", "policy": "shared"}
    )
    _claim_as_dead_worker(env.store, "t1", "call-refund-1", shared=True)
    agent.enqueue("t1")
    with pytest.raises(ThreadStopped):
        agent.wait("t1", timeout=20)
    if settled == "result":
        agent.resolve_effect("t1", "call-refund-1", shared=True, result={"refund_id": "re_9"})
    else:
        agent.resolve_effect("t1", "call-refund-1", shared=True, did_not_run=True)
    assert agent.wait("t1", timeout=20) == "Refunded 10 EUR."
    sent = env.store.downstream_key("t1", "call-refund-1", shared=True)
    assert env.ledger.tool_calls("t1") == ({} if settled == "result" else {sent: 1})
    effect = env.store.effect("t1", "call-refund-1", shared=True)
    assert effect is not None and effect.state == "done"


def test_a_shared_call_left_unknown_names_the_command_that_settles_it(env: Env) -> None:
    agent = env.agent("support_agent")
    env.store.open_thread(
        "t1", task=agent.name, start_grace=3600, input={"question": "hi", "policy": "shared"}
    )
    _claim_as_dead_worker(env.store, "t1", "call-refund-1", shared=True)
    agent.enqueue("t1")
    with pytest.raises(ThreadStopped) as info:
        agent.wait("t1", timeout=20)
    error = info.value.error or ""
    assert "shared key 'call-refund-1'" in error and "earlier worker of this thread" in error
    shown = cli_on(env, "effects", "t1", "--shared", "call-refund-1")
    assert "call-refund-1" in shown.stdout and "outcome unknown" in shown.stdout
    # The command the error names is the one that settles it.
    named = re.search(r"agentq (resolve t1 call-refund-1 --shared) --result JSON", error)
    assert named is not None, error
    settled = cli_on(env, *named.group(1).split(), "--did-not-run")
    assert settled.exit_code == 0, settled.output
    assert agent.wait("t1", timeout=20) == "Refunded 10 EUR."
    sent = env.store.downstream_key("t1", "call-refund-1", shared=True)
    assert env.ledger.tool_calls("t1") == {sent: 1}


def test_a_shared_call_another_thread_still_runs_is_not_said_to_have_died(env: Env) -> None:
    """A thread (a fork, say) reaches a shared key while its source is still inside that
    call: the error names the source, and waiting for it then retrying is what works."""
    agent = env.agent("support_agent")
    env.store.open_thread("src", task=agent.name, start_grace=3600, input={"question": "hi"})
    src = env.store.acquire("src", "src-worker", 30)
    env.store.claim_effect("src", "call-refund-1", src, shared=True, tool="refund")
    agent.delay("t1", question="hi", policy="shared")
    with pytest.raises(ThreadStopped) as info:
        agent.wait("t1", timeout=20)
    error = info.value.error or ""
    assert "earlier worker that died" not in error
    assert "by thread 'src' (token 1, tool refund), which may still be running" in error
    assert "agentq retry t1" in error and "--shared" in error
    refused = cli_on(env, "resolve", "t1", "call-refund-1", "--shared", "--did-not-run")
    assert refused.exit_code == 1 and "claimed by thread 'src'" in refused.stderr
    env.store.complete_effect(
        "src", "call-refund-1", src, {"refund_id": "re_src", "amount": 10}, shared=True
    )
    assert cli_on(env, "retry", "t1").exit_code == 0
    assert agent.wait("t1", timeout=20) == "Refunded 10 EUR."
    assert env.ledger.tool_calls("t1") == {}  # t1 got the result src recorded


def test_append_only_messages_are_written_once_each(env: Env) -> None:
    agent = env.agent("support_agent")
    agent.delay("t1", question="refund my order", refunds=3)
    assert agent.wait("t1", timeout=30) == "Refunded 30 EUR."
    store = env.store
    assert isinstance(store, RedisStore)
    log = store.client.lrange(store.keys.log("t1", "messages"), 0, -1)
    final = store.latest("t1")
    assert final is not None and len(log) == len(final.state["messages"]) == 8
    assert (
        "messages"
        not in decode_envelope("t1", store.client.get(store.keys.checkpoint("t1", final.step)))[0][
            "state"
        ]
    )
    assert [len(c.state["messages"]) for c in store.history("t1")][:3] == [8, 7, 6]


def test_editing_a_committed_append_only_item_fails_the_thread(env: Env) -> None:
    agent = env.agent("broken_agent")
    agent.delay("t1", mode="rewrite_history")
    with pytest.raises(ThreadStopped) as info:
        agent.wait("t1", timeout=10)
    assert "AppendOnlyViolation" in (info.value.error or "")
    assert "state.log[0]" in (info.value.error or "")
    assert env.store.latest("t1").state["log"] == ["started"]  # type: ignore[union-attr]


def test_a_field_declared_append_only_later_keeps_older_threads_running(env: Env) -> None:
    agent = env.agent("notes_agent")
    agent.delay("t1", first="hello")
    wait_until(lambda: agent.thread("t1").status == Status.WAITING, timeout=10, what="waiting")
    agent.append_only = ("notes",)  # what the next deploy declares
    agent.resume("t1", "more")
    assert agent.wait("t1", timeout=30) == ["hello", "asked", "more", "done"]
    history = list(reversed(env.store.history("t1")))
    assert [c.state["notes"] for c in history] == [
        ["hello"],
        ["hello", "asked"],
        ["hello", "asked", "more"],
        ["hello", "asked", "more", "done"],
    ]
    assert [c.logs for c in history] == [{}, {}, {"notes": 3}, {"notes": 4}]


def test_a_log_that_does_not_match_the_thread_fails_it_instead_of_looping(env: Env) -> None:
    agent = env.agent("notes_agent")
    agent.append_only = ("notes",)
    agent.delay("t1", first="hello")
    wait_until(lambda: agent.thread("t1").status == Status.WAITING, timeout=10, what="waiting")
    assert isinstance(env.store, RedisStore)
    env.store.client.rpush(env.store.keys.log("t1", "notes"), b"written by something else")
    agent.resume("t1", "more")
    with pytest.raises(ThreadStopped) as info:
        agent.wait("t1", timeout=30)
    assert info.value.status == "failed" and "LogConflict" in (info.value.error or "")
    assert agent.thread("t1").crashes == 0


def test_a_tool_refused_by_a_rate_limit_runs_again_on_the_retry(env: Env) -> None:
    agent = env.agent("flaky_tool_agent")
    agent.delay("t1", mode="rate_limit")
    assert agent.wait("t1", timeout=30) == "charged 5"
    assert env.ledger.tool_calls("t1") == {"charge": 2}
    assert env.ledger.effects("t1") == {"charge": "5"}


def test_a_tool_that_timed_out_is_not_run_again_blindly(env: Env) -> None:
    agent = env.agent("flaky_tool_agent")
    agent.delay("t1", mode="timeout")  # retried (retry_on), but the charge went through
    with pytest.raises(ThreadStopped) as info:  # did it? a human says
        agent.wait("t1", timeout=30)
    assert info.value.status == "needs_attention" and "charge-1" in (info.value.error or "")
    assert env.store.effect("t1", "charge-1").state == "pending"  # type: ignore[union-attr]
    assert env.ledger.tool_calls("t1") == {"charge": 1}
    assert env.ledger.effects("t1") == {"charge": "5"}


def test_async_tools_are_awaited_under_their_claim(env: Env) -> None:
    agent = env.agent("flaky_tool_agent")
    agent.delay("t1", mode="async")
    assert agent.wait("t1", timeout=30) == "charged 5"
    assert env.store.effect("t1", "charge-1").result == "charged 5"  # type: ignore[union-attr]
    agent.delay("t2", mode="async_as_sync")
    with pytest.raises(ThreadStopped) as info:
        agent.wait("t2", timeout=30)
    assert "run.atool" in (info.value.error or "") and env.ledger.tool_calls("t2") == {}
    agent.delay("t3", mode="async_plain")  # atool with a plain function records it as well
    assert agent.wait("t3", timeout=30) == "charged 5"
    assert env.store.effect("t3", "charge-1").result == "charged 5"  # type: ignore[union-attr]


def test_large_data_lives_in_artifacts_not_checkpoints(env: Env) -> None:
    agent = env.agent("report_agent")
    agent.delay("t1", pages=100_000)  # 500 KB: half the checkpoint limit on its own
    result = agent.wait("t1", timeout=10)
    assert result["size"] == 500_009 and result["ref"]["content_type"] == "application/pdf"
    assert env.store.get_artifact("t1", result["ref"]["artifact"]).startswith(b"%PDF")
    assert len(repr(env.store.latest("t1"))) < 1000  # the checkpoint holds the reference
    env.store.delete_thread("t1")
    with pytest.raises(ArtifactNotFound):
        env.store.get_artifact("t1", result["ref"]["artifact"])


def test_an_oversized_artifact_is_refused_clearly(
    redis_broker: str, redis_server: RedisServer
) -> None:
    prefix = f"ar{uuid.uuid4().hex[:8]}:"
    app = make_app(
        broker=redis_broker,
        store=redis_server.url,
        prefix=prefix,
        queue=f"agentq-test-{prefix}",
        ledger_url=redis_server.url,
        max_artifact_bytes=1000,
    )
    agent = app.tasks["tests.report_agent"]
    with start_worker(app, pool="solo", perform_ping_check=False):
        agent.delay("t1", pages=1000)
        with pytest.raises(ThreadStopped) as info:
            agent.wait("t1", timeout=10)
    assert "ArtifactTooLarge" in (info.value.error or "")
    assert "max_artifact_bytes" in (info.value.error or "")


# Celery's Redis result backend still calls redis-py's deprecated setex.
@pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")
def test_each_step_reports_progress_to_the_result_backend_and_flower(
    redis_broker: str, result_backend: str, redis_server: RedisServer
) -> None:
    prefix = f"pr{uuid.uuid4().hex[:8]}:"
    app = make_app(
        broker=redis_broker,
        store=redis_server.url,
        prefix=prefix,
        queue=f"agentq-test-{prefix}",
        ledger_url=redis_server.url,
    )
    app.conf.result_backend = result_backend
    app.conf.worker_send_task_events = True
    agent = app.tasks["tests.counting_agent"]
    events: list[dict[str, Any]] = []
    listening = threading.Event()

    def listen() -> None:
        with app.connection_for_read() as connection:
            receiver = app.events.Receiver(connection, handlers={"task-progress": events.append})
            # Events sent before the receiver's queue exists are lost: start after it does.
            receiver.on_consume_ready = lambda *args, **kwargs: listening.set()
            with contextlib.suppress(TimeoutError, OSError):
                for _ in receiver.itercapture(limit=None, timeout=20, wakeup=False):
                    if len(events) >= 3:  # worker heartbeats arrive here too
                        break

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert listening.wait(10)
    with start_worker(app, pool="solo", perform_ping_check=False):
        result = agent.delay("t1", n=3, slow=0.5)
        wait_until(lambda: result.state == "PROGRESS", timeout=10, what="PROGRESS state")
        assert result.info["thread_id"] == "t1" and result.info["node"] in ("start", "count")
        assert agent.wait("t1", timeout=20) == 3
        listener.join(20)
    assert [(e["thread_id"], e["step"], e["node"]) for e in events[:3]] == [
        ("t1", 0, "start"),
        ("t1", 1, "count"),
        ("t1", 2, "count"),
    ]
    app.close()


def test_a_worker_started_with_dash_e_sends_the_progress_events(
    redis_broker: str, redis_server: RedisServer
) -> None:
    """``celery worker -E`` gives the worker ``task_events`` without setting
    ``worker_send_task_events`` in the app's conf: Flower watching such a worker still
    sees each committed node."""
    prefix = f"pe{uuid.uuid4().hex[:8]}:"
    app = make_app(
        broker=redis_broker,
        store=redis_server.url,
        prefix=prefix,
        queue=f"agentq-test-{prefix}",
        ledger_url=redis_server.url,
    )
    assert not app.conf.worker_send_task_events
    agent = app.tasks["tests.counting_agent"]
    events: list[dict[str, Any]] = []
    listening = threading.Event()

    def listen() -> None:
        with app.connection_for_read() as connection:
            receiver = app.events.Receiver(connection, handlers={"task-progress": events.append})
            receiver.on_consume_ready = lambda *args, **kwargs: listening.set()
            with contextlib.suppress(TimeoutError, OSError):
                for _ in receiver.itercapture(limit=None, timeout=20, wakeup=False):
                    if len(events) >= 2:
                        break

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert listening.wait(10)
    with start_worker(app, pool="solo", perform_ping_check=False, task_events=True):
        agent.delay("t1", n=1)
        assert agent.wait("t1", timeout=20) == 1
        listener.join(20)
    assert [(e["thread_id"], e["step"], e["node"]) for e in events] == [
        ("t1", 0, "start"),
        ("t1", 1, "count"),
    ]
    app.close()


def cli_on(env: Env, *args: str) -> Result:
    """The ``agentq`` command against the env's store (its workers' sweepers send what
    it queues)."""
    settings = env.app._agentq_runtime.settings
    return CliRunner().invoke(
        cli, ["--store", settings.store, "--prefix", settings.prefix, *args], catch_exceptions=False
    )


def test_a_fork_waiting_on_an_interrupt_is_started_and_answered_from_the_cli(env: Env) -> None:
    agent = env.agent("approval_agent")
    agent.delay("t1", amount=30)
    wait_until(lambda: agent.thread("t1").status == Status.WAITING, timeout=10, what="waiting")
    forked = cli_on(env, "fork", "t1", "--from", "0", "--to", "f1")
    assert forked.exit_code == 0, forked.output
    assert "agentq resume f1 --value JSON" in " ".join(forked.stdout.split())
    # As the hint says: without --value the fork runs on and asks again.
    assert cli_on(env, "resume", "f1").exit_code == 0
    wait_until(lambda: agent.thread("f1").status != Status.QUEUED, timeout=20, what="fork started")
    wait_until(lambda: agent.thread("f1").status == Status.WAITING, timeout=20, what="asking")
    assert agent.thread("f1").interrupt == {"question": "refund 30?"}
    # A wrong answer fails the node given it; a new answer resumes it.
    assert cli_on(env, "resume", "f1", "--value", '"yes"').exit_code == 0
    wait_until(lambda: agent.thread("f1").status == Status.FAILED, timeout=20, what="failed")
    assert cli_on(env, "resume", "f1", "--value", '{"approved": true}').exit_code == 0
    wait_until(
        lambda: agent.thread("f1").interrupt == {"question": "anything else?"},
        timeout=20,
        what="second question",
    )
    agent.resume("f1", "thanks")
    assert agent.wait("f1", timeout=20) == {"approved": True, "note": "thanks"}


def test_the_error_and_the_listing_name_the_same_step(env: Env) -> None:
    agent = env.agent("broken_agent")
    agent.delay("t1", mode="unstorable")
    with pytest.raises(ThreadStopped):
        agent.wait("t1", timeout=10)
    error = agent.thread("t1").error or ""
    assert "step 1: state.handle" in error  # checkpoint 0 is the latest: step 1 failed
    listed = cli_on(env, "threads")
    row = next(line for line in listed.stdout.splitlines() if line.startswith("t1 "))
    assert row.split()[:3] == ["t1", "failed", "1"]
    shown = cli_on(env, "show", "t1").stdout
    assert "1  (node work; latest checkpoint 0)" in shown
