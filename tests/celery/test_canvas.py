"""A Celery canvas around a thread that another task finishes: the chain, chord, ``link``
and ``link_error`` of the first message carry on as if the first task had returned (or
failed with) the thread's outcome, once, on an in-process worker with a real backend."""

from __future__ import annotations

import gc
import threading
import uuid
import warnings
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery, Task, chain, chord
from celery.contrib.testing.worker import start_worker
from celery.exceptions import ChordError
from celery.result import AsyncResult
from celery.signals import before_task_publish, task_postrun, task_revoked
from celery.worker import state as worker_state
from kombu.exceptions import ContentDisallowed
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

import agentq
from agentq import Done, FunctionAgent, Run, Status
from agentq.celery import canvas
from agentq.celery.task import STORED_HEADER
from agentq.celery.task_outcome import WAITING, WAITING_FOR_KEY
from agentq.records import Checkpoint, ThreadMeta
from agentq.store.redis.store import RedisStore
from tests.chaos.flaky_proxy import FlakyProxy
from tests.support.redis_server import RedisServer, running_redis, wait_until

pytestmark = pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")


SOLO = "solo"
"""A concurrency key one thread holds at a time."""


@dataclass
class Env:
    app: Celery
    agent: FunctionAgent
    notify: Any
    collect: Any
    on_error: Any
    notified: list[Any] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def waiting(self, first: AsyncResult) -> None:
        wait_until(lambda: first.state == WAITING, timeout=20, what=f"{first.id} WAITING")


def define(app: Celery, env_lists: tuple[list[Any], list[str]]) -> tuple[Any, ...]:
    notified, errors = env_lists
    agent = agentq.agent(app, "tests.canvas")

    @agent.node
    def start(run: Run, mode: str) -> Any:
        if mode == "fast":
            return Done(run.thread_id)
        answer = run.interrupt({"question": "go on?"})
        if mode == "wait_then_fail":
            raise ValueError(f"refused: {answer}")
        return Done({"answer": answer})

    @app.task(name="tests.canvas.notify", shared=False)
    def notify(result: Any) -> Any:
        notified.append(result)
        return ["notified", result]

    @app.task(name="tests.canvas.collect", shared=False)
    def collect(results: list[Any]) -> list[Any]:
        return results

    @app.task(name="tests.canvas.on_error", shared=False)
    def on_error(task_id: str) -> None:
        errors.append(task_id)

    return agent, notify, collect, on_error


@pytest.fixture
def env(
    request: pytest.FixtureRequest,
    redis_broker: str,
    result_backend: str,
    redis_server: RedisServer,
) -> Iterator[Env]:
    prefix = f"cv{uuid.uuid4().hex[:8]}:"
    backend = getattr(request, "param", None) or result_backend
    app = Celery("agentq-canvas", broker=redis_broker, backend=backend, set_as_current=False)
    app.conf.update(
        task_default_queue=f"agentq-test-{prefix}",
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    agentq.init_app(
        app,
        store=redis_server.url,
        prefix=prefix,
        lease_ttl=5,
        start_grace=5,
        sweep_interval=0.1,
        limits=[agentq.limit(SOLO, threads=1)],
    )
    notified: list[Any] = []
    errors: list[str] = []
    env = Env(app, *define(app, (notified, errors)), notified=notified, errors=errors)
    with start_worker(
        app, pool="threads", concurrency=2, perform_ping_check=False, shutdown_timeout=30
    ):
        yield env
    # Results unsubscribe from the backend when collected: now, while it still runs.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "unclosed <socket.socket", ResourceWarning)
        gc.collect()
    app._agentq_runtime.store.close()
    app.close()


def test_a_chain_goes_on_with_the_result_of_a_thread_resumed_in_a_later_task(env: Env) -> None:
    result = chain(env.agent.si("c1", mode="wait"), env.notify.s()).apply_async()
    first = result.parent
    env.waiting(first)
    resumed = env.agent.resume("c1", "yes")
    assert resumed.get(timeout=20) == {"answer": "yes"}
    assert result.get(timeout=20) == ["notified", {"answer": "yes"}]
    assert first.get(timeout=20) == {"answer": "yes"}
    assert env.notified == [{"answer": "yes"}]
    # The resumed task carried no canvas of its own: it applied nothing.
    assert AsyncResult(resumed.id, app=env.app).children == []
    assert [child.id for child in first.children] == [result.id]


def test_a_chain_whose_thread_ends_in_its_first_task_runs_on_once(env: Env) -> None:
    result = chain(env.agent.si("c2", mode="fast"), env.notify.s()).apply_async()
    assert result.get(timeout=20) == ["notified", "c2"]
    assert env.notified == ["c2"]


def test_a_thread_sent_with_ignore_result_stores_no_result_from_its_later_tasks(
    env: Env,
) -> None:
    """``ignore_result`` given to the first message holds for the whole thread: the task
    that ends it carries the chain on, and stores no result, under its id or the first."""
    ended: list[str] = []

    def on_postrun(task_id: str | None = None, **_: Any) -> None:
        ended.append(task_id or "")

    task_postrun.connect(on_postrun, weak=False)
    try:
        quiet = env.agent.si("c-quiet", mode="wait").set(ignore_result=True)
        result = chain(quiet, env.notify.s()).apply_async()
        first = result.parent
        wait_until(lambda: first.id in ended, timeout=20, what="the first task ended")
        resumed = env.agent.resume("c-quiet", "yes")
        assert result.get(timeout=20) == ["notified", {"answer": "yes"}]
        wait_until(lambda: resumed.id in ended, timeout=20, what="the resumed task ended")
    finally:
        task_postrun.disconnect(on_postrun)
    assert env.notified == [{"answer": "yes"}]
    assert AsyncResult(first.id, app=env.app).state == "PENDING"
    assert AsyncResult(resumed.id, app=env.app).state == "PENDING"


def test_a_chord_counts_a_part_resumed_in_a_later_task_and_runs_its_body(env: Env) -> None:
    parts = [env.agent.si("k1", mode="wait"), env.agent.si("k2", mode="fast")]
    result = chord(parts)(env.collect.s())
    wait_until(lambda: env.agent.thread("k1").status == "waiting", timeout=20, what="k1 waiting")
    assert env.agent.wait("k2", timeout=20) == "k2"
    assert not result.ready()
    env.agent.resume("k1", "yes")
    assert result.get(timeout=20) == [{"answer": "yes"}, "k2"]


def test_a_chord_fails_once_a_part_is_cancelled_as_when_a_part_is_revoked(env: Env) -> None:
    """Celery counts a revoked part, and fails the chord with a ``ChordError`` naming it;
    a part whose thread is cancelled while it waits for a person is counted the same way,
    rather than leave the chord waiting for good."""
    parts = [env.agent.si("k5", mode="wait"), env.agent.si("k6", mode="fast")]
    result = chord(parts)(env.collect.s())
    wait_until(lambda: env.agent.thread("k5").status == "waiting", timeout=20, what="k5 waiting")
    assert env.agent.wait("k6", timeout=20) == "k6"
    assert env.agent.cancel("k5") == Status.CANCELLED
    with pytest.raises(ChordError, match="was cancelled"):
        result.get(timeout=20, follow_parents=False)
    assert AsyncResult(result.parent.results[0].id, app=env.app).state == "REVOKED"
    assert env.agent.cancel("k5") == Status.CANCELLED  # asked again: counted once


# Celery's Redis backend ignores a part counted twice; its key-value backends do not.
@pytest.mark.parametrize("env", [None, "cache+memory://"], ids=["redis", "cache"], indirect=True)
def test_a_chord_counts_a_revoked_part_once(env: Env) -> None:
    """Celery counts the revoked first message's part itself; the cancel of its thread that
    follows counts nothing more, so the chord still waits for its other parts."""
    handled = threading.Event()

    def after_agentqs_handler(**_: Any) -> None:  # connected after it: called after it
        handled.set()

    parts = [
        env.agent.si("k7", mode="fast").set(countdown=1),
        env.agent.si("k8", mode="wait"),
        env.agent.si("k9", mode="fast"),
    ]
    task_revoked.connect(after_agentqs_handler, weak=False)
    try:
        result = chord(parts)(env.collect.s())
        first = result.parent.results[0]
        first.revoke()
        wait_until(lambda: env.agent.thread("k8").status == "waiting", timeout=20, what="k8")
        assert env.agent.wait("k9", timeout=20) == "k9"
        assert handled.wait(20)
    finally:
        task_revoked.disconnect(after_agentqs_handler)
    assert env.agent.thread("k7").status == Status.CANCELLED
    assert not result.ready()  # counted twice, the revoked part would have fired the body
    env.agent.resume("k8", "yes")
    with pytest.raises(ChordError, match="TaskRevokedError"):
        result.get(timeout=20, follow_parents=False)


@pytest.mark.parametrize("env", [None, "cache+memory://"], ids=["redis", "cache"], indirect=True)
def test_a_chord_counts_once_a_part_revoked_while_parked_and_cancelled_when_woken(
    env: Env,
) -> None:
    """The part's first task ran and parked the thread, so no message holds its id when
    it is revoked, and Celery counts nothing; the woken thread's cancel counts the part as
    revoked, once, though recovery and the wake may both send the thread."""
    store = env.app._agentq_runtime.store
    store.open_thread("holder", task="elsewhere")
    holder = store.acquire("holder", "elsewhere", 60)
    assert store.enter_key("holder", "elsewhere", holder, SOLO, 1) == 0
    parts = [
        env.agent.si("k10", mode="fast").set(concurrency_key=SOLO),
        env.agent.si("k11", mode="wait"),
        env.agent.si("k12", mode="fast"),
    ]
    result = chord(parts)(env.collect.s())
    first = result.parent.results[0]
    wait_until(lambda: first.state == WAITING_FOR_KEY, timeout=20, what="k10 parked")
    first.revoke()
    wait_until(lambda: first.id in worker_state.revoked, timeout=20, what="the revoke received")
    assert store.leave_key("holder", holder, SOLO, start_grace=0) == ["k10"]
    env.agent.enqueue("k10")  # as the holder's task sends the thread its leaving wakes
    wait_until(lambda: first.state == "REVOKED", timeout=20, what="k10's first task REVOKED")
    assert env.agent.thread("k10").status == Status.CANCELLED
    wait_until(lambda: env.agent.thread("k11").status == "waiting", timeout=20, what="k11")
    assert env.agent.wait("k12", timeout=20) == "k12"
    assert not result.ready()  # counted twice, the revoked part would have fired the body
    env.agent.resume("k11", "yes")
    with pytest.raises(ChordError, match="was cancelled"):
        result.get(timeout=20, follow_parents=False)


def test_link_runs_after_a_thread_resumed_in_a_later_task(env: Env) -> None:
    first = env.agent.apply_async(("l1",), {"mode": "wait"}, link=env.notify.s())
    env.waiting(first)
    env.agent.resume("l1", "ok")
    assert first.get(timeout=20) == {"answer": "ok"}
    wait_until(lambda: env.notified, timeout=20, what="the link run")
    assert env.notified == [{"answer": "ok"}]


def test_link_error_runs_when_the_thread_fails_in_a_later_task(env: Env) -> None:
    first = env.agent.apply_async(
        ("e1",), {"mode": "wait_then_fail"}, link=env.notify.s(), link_error=env.on_error.s()
    )
    env.waiting(first)
    resumed = env.agent.resume("e1", "no")
    with pytest.raises(ValueError, match="refused: no"):
        first.get(timeout=20)
    wait_until(lambda: env.errors, timeout=20, what="the errback run")
    assert env.errors == [first.id]
    with pytest.raises(ValueError, match="refused: no"):
        resumed.get(timeout=20)
    assert env.notified == []


def test_the_first_message_again_after_another_task_ended_its_thread_applies_nothing(
    env: Env,
) -> None:
    ended: list[tuple[str, str]] = []

    def record(task_id: str, state: str, **kwargs: Any) -> None:
        ended.append((task_id, state))

    task_postrun.connect(record, weak=False)
    try:
        first = env.agent.apply_async(("r1",), {"mode": "wait"}, link=env.notify.s())
        env.waiting(first)
        env.agent.resume("r1", "ok")
        wait_until(lambda: env.notified, timeout=20, what="the link run")
        # The first message delivered again (a redelivery, or one delayed past its start
        # grace), with its canvas: the task that ended the thread applied it already.
        redelivered = {"task_id": first.id, "headers": {STORED_HEADER: True}}
        Task.apply_async(env.agent, ("r1",), None, link=env.notify.s(), **redelivered)
        again = wait_until(
            lambda: [state for id, state in ended if id == first.id][1:],
            timeout=20,
            what="the first again",
        )
    finally:
        task_postrun.disconnect(record)
    assert again == ["IGNORED"]
    assert first.get(timeout=20) == {"answer": "ok"}
    assert env.notified == [{"answer": "ok"}]


def test_the_first_message_redelivered_after_its_run_ended_the_thread_carries_the_canvas_on(
    env: Env,
) -> None:
    """The first task committed the thread's end and its worker died before Celery applied
    the canvas (``acks_late``): the redelivered message carries it on."""
    store, first_id = env.agent.agentq.store, uuid.uuid4().hex
    store.open_thread(
        "r2",
        task=env.agent.name,
        input={"mode": "fast"},
        origin=first_id,
        canvas=canvas.captured({"link": env.notify.s()}, "json"),
        start_grace=3600,
    )
    token = store.acquire("r2", "the-lost-worker", 30)
    store.commit(
        "r2", token, Checkpoint(step=0, node=None, token=token), status=Status.DONE, result="r2"
    )
    redelivered = {"task_id": first_id, "headers": {STORED_HEADER: True}}
    Task.apply_async(env.agent, ("r2",), None, link=env.notify.s(), **redelivered)
    assert AsyncResult(first_id, app=env.app).get(timeout=20) == "r2"
    wait_until(lambda: env.notified, timeout=20, what="the link run")
    assert env.notified == ["r2"]


def test_link_error_runs_when_a_later_message_finds_the_thread_failed(env: Env) -> None:
    """A thread failed without its canvas carried on (here by hand; by its lost workers in
    a recovery message alike): the next message of it carries the canvas on."""
    failures: list[str] = []

    # An errback that takes the failure, which the backend calls in place rather than
    # sends: this test's one message is the thread's.
    @env.app.task(name="tests.canvas.on_failure", shared=False)
    def on_failure(request: Any, exc: BaseException, traceback: Any) -> None:
        failures.append(request.id)

    first = env.agent.apply_async(("e2",), {"mode": "wait"}, link_error=on_failure.s())
    env.waiting(first)
    store = env.agent.agentq.store
    store.reopen("e2", from_statuses={Status.WAITING}, start_grace=3600)
    token = store.acquire("e2", "the-lost-worker", 30)
    store.set_status("e2", token, Status.FAILED, error="worker lost 3 times", release_owner="x")
    later = env.agent.delay("e2")
    # Read, not raised: Celery's backend rebuilds agentq's exception as a stand-in.
    assert "worker lost 3 times" in str(later.get(timeout=20, propagate=False))
    assert "worker lost 3 times" in str(first.get(timeout=20, propagate=False))
    assert first.state == "FAILURE"
    wait_until(lambda: failures, timeout=20, what="the errback run")
    assert failures == [first.id]


STORED = ThreadMeta(
    thread_id="p1",
    status=Status.DONE,
    step=0,
    node=None,
    task="tests.canvas",
    attempts=0,
    crashes=0,
    fence=1,
    error=None,
    created_at=0.0,
    updated_at=0.0,
    origin="first",
)


def test_a_canvas_is_kept_with_the_serializer_its_message_uses() -> None:
    """What a pickled message carries (a set among a callback's arguments), the thread
    keeps: the canvas is encoded as the message is, and read back only if accepted."""
    app = Celery("agentq-canvas-pickle", set_as_current=False)
    callback = app.signature("tests.canvas.notify", args=({"a", "b"},))
    kept = canvas.captured({"link": callback}, "pickle")
    assert kept is not None and kept["content_type"] == "application/x-python-serialize"
    meta = replace(STORED, canvas=kept)
    request = canvas.request_of(meta, ["pickle"])
    assert request is not None and request.callbacks[0]["args"] == ({"a", "b"},)
    with pytest.raises(ContentDisallowed):
        canvas.request_of(meta, ["json"])


def test_a_store_error_while_naming_the_canvas_taker_is_waited_out(
    redis_broker: str, result_backend: str, tmp_path: Path
) -> None:
    """The task that finds its thread done names itself the taker of the first task's
    canvas in the store; a store error there (a failover outlasting redis-py's retries)
    must be waited out like any other of the task's store calls. Failing the task instead
    would drop the canvas for good: the thread is done, so no later task comes to carry
    the chain on, and the first task's result stays unready."""
    notified: list[Any] = []
    errors: list[str] = []
    with running_redis(tmp_path / "store") as server, closing(FlakyProxy(server.port)) as proxy:
        # Quick retries, so that the error outlasts them at once.
        client = redis.Redis(port=proxy.port, retry=Retry(ExponentialBackoff(0.02, 0.01), 2))
        store = RedisStore(client, prefix="cvf:")
        app = Celery("agentq-canvas-fault", broker=redis_broker, backend=result_backend)
        app.conf.update(
            task_default_queue=f"agentq-test-cvf-{uuid.uuid4().hex[:8]}",
            worker_hijack_root_logger=False,
        )
        agentq.init_app(app, store=store, lease_ttl=5, start_grace=5, sweep_interval=0.1)
        agent, notify, _, _ = define(app, (notified, errors))
        try:
            with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False):
                first = agent.apply_async(("f1",), {"mode": "wait"}, link=notify.s())
                wait_until(lambda: first.state == WAITING, timeout=20, what="WAITING")
                proxy.drop = store._scripts["take_canvas"].sha.encode()
                threading.Thread(target=back_after_retries, args=(proxy,), daemon=True).start()
                resumed = agent.resume("f1", "ok")
                assert resumed.get(timeout=20) == {"answer": "ok"}
                assert first.get(timeout=20) == {"answer": "ok"}
                wait_until(lambda: notified, timeout=20, what="the link run")
                assert notified == [{"answer": "ok"}]
        finally:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "unclosed <socket.socket", ResourceWarning)
                gc.collect()
            store.close()
            app.close()


def back_after_retries(proxy: FlakyProxy) -> None:
    """Let calls through again once the first one failed through all of redis-py's tries."""
    wait_until(lambda: proxy.dropped >= 3, timeout=20, what="three dropped tries")
    proxy.drop = None


def test_the_first_message_again_after_its_own_run_applied_the_canvas_applies_nothing(
    env: Env,
) -> None:
    """The first task ended its thread and Celery applied its canvas; then a copy of its
    message comes (RabbitMQ redelivering on a connection loss, a Redis visibility timeout
    restoring it, queued behind a backlog while the first run finished): the canvas went
    on already, and must not go on again."""
    ran: list[str] = []
    sent: list[str] = []

    def record(task_id: str, **kwargs: Any) -> None:
        ran.append(task_id)

    def publishing(sender: str | None = None, **kwargs: Any) -> None:
        sent.append(str(sender))

    task_postrun.connect(record, weak=False)
    try:
        first = env.agent.apply_async(("d1",), {"mode": "fast"}, link=env.notify.s())
        assert first.get(timeout=20) == "d1"
        wait_until(lambda: env.notified, timeout=20, what="the link run")
        before_task_publish.connect(publishing, weak=False)
        redelivered = {"task_id": first.id, "headers": {STORED_HEADER: True}}
        Task.apply_async(env.agent, ("d1",), None, link=env.notify.s(), **redelivered)
        # Celery applies a task's canvas before task_postrun: all is sent by then.
        wait_until(lambda: ran.count(first.id) == 2, timeout=20, what="the copy run")
    finally:
        task_postrun.disconnect(record)
        before_task_publish.disconnect(publishing)
    assert sent == [env.agent.name]  # the copy itself, and no second notify
    assert AsyncResult(first.id, app=env.app).get(timeout=20) == "d1"


def test_a_copy_of_the_message_that_ended_the_thread_applies_nothing(env: Env) -> None:
    """A later message (a resume's) ended the thread and carried the first task's canvas
    on; a copy of it, delivered again once it had run, carries nothing on again."""
    ran: list[str] = []
    sent: list[str] = []

    def record(task_id: str, **kwargs: Any) -> None:
        ran.append(task_id)

    def publishing(sender: str | None = None, **kwargs: Any) -> None:
        sent.append(str(sender))

    task_postrun.connect(record, weak=False)
    try:
        first = env.agent.apply_async(("d2",), {"mode": "wait"}, link=env.notify.s())
        env.waiting(first)
        resumed = env.agent.resume("d2", "ok")
        assert first.get(timeout=20) == {"answer": "ok"}
        wait_until(lambda: env.notified, timeout=20, what="the link run")
        wait_until(lambda: resumed.id in ran, timeout=20, what="the resume's run")
        before_task_publish.connect(publishing, weak=False)
        again = {"task_id": resumed.id, "headers": {STORED_HEADER: True}}
        Task.apply_async(env.agent, ("d2",), None, **again)
        wait_until(lambda: ran.count(resumed.id) == 2, timeout=20, what="the copy run")
    finally:
        task_postrun.disconnect(record)
        before_task_publish.disconnect(publishing)
    assert sent == [env.agent.name]
    assert env.notified == [{"answer": "ok"}]
