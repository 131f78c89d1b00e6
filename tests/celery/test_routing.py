"""A thread's later messages go where its user routed its first one, on Redis and
RabbitMQ: to a worker that consumes only the agents' queue, never to the default queue."""

from __future__ import annotations

import contextlib
import datetime
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.exceptions import CDeprecationWarning
from kombu import Exchange, Queue

import agentq
from agentq import AgentTask, Done, Interrupt, Run
from agentq.ops.control import requeue
from agentq.records import Status
from tests.support.redis_server import RedisServer, wait_until


def seen(task: AgentTask) -> dict[str, Any]:
    """What a node sees of the message that runs it."""
    request = task.request
    info = request.delivery_info or {}
    return {
        "routing_key": info.get("routing_key"),
        "exchange": info.get("exchange") or "",
        "priority": info.get("priority"),
        "timelimit": list(request.timelimit or (None, None)),
        "tenant": request.get("tenant"),
    }


class Recorder(AgentTask):
    """Records what its message looked like, waits for a person, records it again."""

    name = "tests.routing.recorder"

    def start(self, run: Run) -> Interrupt:
        run.state["first"] = seen(self)
        return Interrupt({"question": "go on?"}, resume_at="finish")

    def finish(self, run: Run) -> Done:
        return Done({"first": run.state["first"], "later": seen(self), "by": self.request.id})


class Env:
    def __init__(self, app: Celery, queue: str, name: str) -> None:
        self.app = app
        self.queue = queue
        self.agent: Recorder = app.tasks[name]

    def pending(self, queue: str) -> int:
        """Messages waiting in ``queue`` that no worker took."""
        with self.app.connection_for_write() as conn, conn.channel() as channel:
            try:
                return int(channel.queue_declare(queue, passive=True).message_count)
            except Exception:  # never declared: nothing was ever sent there
                return 0

    def run_to_the_end(self, thread_id: str) -> dict[str, Any]:
        wait_until(
            lambda: self.agent.thread(thread_id).status == Status.WAITING,
            timeout=20,
            what="the thread waiting",
        )
        self.agent.resume(thread_id)
        result: dict[str, Any] = self.agent.wait(thread_id, timeout=20)
        return result


def make_app(
    broker: str, store: str, prefix: str | None = None, limits: Any = (), **conf: Any
) -> Celery:
    prefix = prefix or f"rt{uuid.uuid4().hex[:8]}:"
    app = Celery("agentq-routing-tests", broker=broker, set_as_current=False)
    app.conf.update(
        task_default_queue=f"agentq-test-default-{prefix}",
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        **conf,
    )
    agentq.init_app(
        app, store=store, prefix=prefix, sweep_interval=0.2, start_grace=5, limits=limits
    )
    return app


@contextlib.contextmanager
def running(app: Celery, queue: str, agent: type[AgentTask] = Recorder) -> Iterator[Env]:
    with warnings.catch_warnings():
        # Celery 5.7 deprecates a task class's routing attributes; they route until 6.0.
        warnings.simplefilter("ignore", CDeprecationWarning)
        app.register_task(agent())
    with start_worker(
        app,
        pool="threads",
        concurrency=2,
        perform_ping_check=False,
        shutdown_timeout=30,
        queues=[queue],
    ):
        yield Env(app, queue, agent.name)
    app._agentq_runtime.store.close()
    app.close()


@pytest.fixture(params=["redis", "rabbitmq"])
def broker(request: pytest.FixtureRequest) -> str:
    fixture = "redis_broker" if request.param == "redis" else "rabbitmq_broker"
    url: str = request.getfixturevalue(fixture)
    return url


def test_per_call_options_reach_the_resumed_run(broker: str, redis_server: RedisServer) -> None:
    queue = f"agents-{uuid.uuid4().hex[:8]}"
    app = make_app(broker, redis_server.url)
    with running(app, queue) as env:
        env.agent.apply_async(
            ("t1",),
            queue=queue,
            priority=3,
            time_limit=120,
            soft_time_limit=100,
            headers={"tenant": "acme"},
        )
        result = env.run_to_the_end("t1")
        assert result["later"] == result["first"], result
        # A fork of it, resumed, is sent as its source was.
        app._agentq_runtime.store.fork("t1", 0, "t1-fork")
        assert env.run_to_the_end("t1-fork")["later"] == result["first"]
        assert env.pending(app.conf.task_default_queue) == 0


class QueuedByClass(Recorder):
    name = "tests.routing.by_class"
    queue = "agents-by-class"
    priority = 2


def test_a_task_class_queue_is_kept_when_the_app_lacks_the_agent(
    broker: str, redis_server: RedisServer
) -> None:
    """``agentq -A proj resume`` loads the app, not the module of its agents (they load in
    the workers, through ``include``): the message is sent by the agent's name."""
    app = make_app(broker, redis_server.url)
    with running(app, QueuedByClass.queue, QueuedByClass) as env:
        agent = app.tasks[QueuedByClass.name]
        agent.apply_async(("t1",), time_limit=120, headers={"tenant": "acme"})
        wait_until(lambda: agent.thread("t1").status == Status.WAITING, timeout=20, what="waiting")
        cli_app = make_app(broker, redis_server.url, app._agentq_runtime.settings.prefix)
        cli_app.conf.task_default_queue = app.conf.task_default_queue
        requeued = requeue(
            app._agentq_runtime.store,
            cli_app,
            "t1",
            from_statuses={Status.WAITING},
            start_grace=5,
        )
        result = agent.wait("t1", timeout=20)
        assert result["later"] == result["first"], result
        assert result["by"] == requeued.sent  # not recovery's message, a start grace later
        assert env.pending(app.conf.task_default_queue) == 0


def test_task_routes_route_every_later_message(broker: str, redis_server: RedisServer) -> None:
    queue = f"agents-{uuid.uuid4().hex[:8]}"
    app = make_app(broker, redis_server.url, task_routes={Recorder.name: {"queue": queue}})
    with running(app, queue) as env:
        env.agent.delay("t1")
        result = env.run_to_the_end("t1")
        assert result["later"] == result["first"], result
        assert result["first"]["routing_key"] == queue
        assert env.pending(app.conf.task_default_queue) == 0


def test_an_exchange_and_routing_key_stay_with_the_thread(
    rabbitmq_broker: str, redis_server: RedisServer
) -> None:
    """Sent to a topic exchange by routing key alone, as RabbitMQ users route (kombu's
    Redis transport drops such a message, of any task, even the first)."""
    queue = f"agents-{uuid.uuid4().hex[:8]}"
    exchange = Exchange(f"{queue}-topic", type="topic")
    app = make_app(
        rabbitmq_broker,
        redis_server.url,
        task_queues=[Queue(queue, exchange, routing_key="agents.#")],
    )
    with running(app, queue) as env:
        env.agent.apply_async(("t1",), exchange=exchange.name, routing_key="agents.support")
        result = env.run_to_the_end("t1")
        assert result["later"] == result["first"], result
        assert result["first"]["routing_key"] == "agents.support"
        assert env.pending(app.conf.task_default_queue) == 0


def test_a_queue_object_stays_with_the_thread(broker: str, redis_server: RedisServer) -> None:
    """A kombu ``Queue`` given per call, bound to an exchange of its own, that the app
    does not declare."""
    name = f"agents-{uuid.uuid4().hex[:8]}"
    queue = Queue(name, Exchange(f"{name}-direct"), routing_key=f"{name}.key")
    app = make_app(broker, redis_server.url)
    with running(app, name) as env:
        env.agent.apply_async(("t1",), queue=queue)
        result = env.run_to_the_end("t1")
        assert env.pending(app.conf.task_default_queue) == 0
        assert result["later"] == result["first"], result


class ExpiringByClass(Recorder):
    """Its messages are worthless unless a worker starts them at once."""

    name = "tests.routing.expiring"
    expires = 0.001


def test_a_class_expires_stops_only_the_first_message(
    redis_broker: str, redis_server: RedisServer
) -> None:
    """A later message (here a resume's) expiring would only be dropped, the thread left
    queued for recovery to send again, with the same expires, for as long as the class
    says so: the thread would never run again."""
    queue = f"agents-{uuid.uuid4().hex[:8]}"
    app = make_app(redis_broker, redis_server.url)
    with running(app, queue, ExpiringByClass) as env:
        env.agent.apply_async(("t1",), queue=queue, expires=None)  # this first one runs
        result = env.run_to_the_end("t1")
        assert result["later"] == result["first"], result


@pytest.mark.parametrize("delay", ["countdown", "eta"])
def test_a_delayed_resume_runs_when_asked(
    redis_broker: str, redis_server: RedisServer, delay: str
) -> None:
    """Recovery holds off until the resume's own message is due, as it does for a first
    message sent with a countdown: it would otherwise run the thread a start grace after
    the resume, long before the time its caller chose."""
    queue = f"agents-{uuid.uuid4().hex[:8]}"
    app = make_app(redis_broker, redis_server.url)
    with running(app, queue) as env:
        env.agent.apply_async(("t1",), queue=queue)
        wait_until(
            lambda: env.agent.thread("t1").status == Status.WAITING, timeout=20, what="waiting"
        )
        later = 8.0  # past the start grace (5 s)
        when = (
            {"countdown": later}
            if delay == "countdown"
            else {"eta": datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=later)}
        )
        resumed = env.agent.resume("t1", **when)
        assert env.agent.wait("t1", timeout=30)["by"] == resumed.id


class Solo(AgentTask):
    """One thread at a time; the first one holds its slot until the test opens its gate."""

    name = "tests.routing.solo"
    concurrency_key = "solo"

    def start(self, run: Run, gate: str = "") -> str:
        ledger = redis.Redis.from_url(self.app.conf.test_store)
        while gate and not ledger.exists(gate):
            ledger.blpop([f"{gate}:never"], timeout=0.1)
        run.state["seen"] = seen(self)
        return "finish"

    def finish(self, run: Run) -> Done:
        return Done(run.state["seen"])


def test_a_thread_woken_for_its_concurrency_key_keeps_its_route(
    broker: str, redis_server: RedisServer
) -> None:
    queue = f"agents-{uuid.uuid4().hex[:8]}"
    app = make_app(
        broker,
        redis_server.url,
        limits=[agentq.limit("solo", threads=1)],
        test_store=redis_server.url,
    )
    gate = f"gate-{uuid.uuid4().hex[:8]}"
    with running(app, queue, Solo) as env:
        options: dict[str, Any] = {
            "queue": queue,
            "priority": 3,
            "time_limit": 120,
            "headers": {"tenant": "acme"},
        }
        env.agent.apply_async(("holder",), {"gate": gate}, **options)
        wait_until(
            lambda: env.agent.thread("holder").status == Status.RUNNING,
            timeout=20,
            what="the slot taken",
        )
        env.agent.apply_async(("parked",), **options)
        store = app._agentq_runtime.store
        wait_until(
            lambda: (
                [w.thread_id for state in store.key_states() for w in state.waiting] == ["parked"]
            ),
            timeout=20,
            what="the second thread parked",
        )
        with redis.Redis.from_url(redis_server.url) as client:
            client.set(gate, 1)
        assert env.agent.wait("parked", timeout=20) == {
            "routing_key": queue,
            "exchange": "",
            "priority": 3,
            "timelimit": [120, None],
            "tenant": "acme",
        }
        assert env.pending(app.conf.task_default_queue) == 0


def test_no_headers_for_one_send_keep_the_threads(
    redis_broker: str, redis_server: RedisServer
) -> None:
    """``headers=None``, as a wrapper passing its own options through gives it."""
    queue = f"agents-{uuid.uuid4().hex[:8]}"
    app = make_app(redis_broker, redis_server.url)
    with running(app, queue) as env:
        env.agent.apply_async(("t1",), queue=queue, headers={"tenant": "acme"})
        wait_until(
            lambda: env.agent.thread("t1").status == Status.WAITING, timeout=20, what="waiting"
        )
        env.agent.resume("t1", headers=None)
        assert env.agent.wait("t1", timeout=20)["later"]["tenant"] == "acme"
