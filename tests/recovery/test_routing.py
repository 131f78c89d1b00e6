"""A thread routed per call to a queue of its own stays there when its worker dies or
shuts down: recovery's and the hand-over's messages reach only the workers of that queue,
on real ``celery worker -Q`` subprocesses, while a worker of the default queue (whose
sweeper may be the one sending) never receives an agent task."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.recovery.test_crash import BROKERS, Cluster
from tests.support.redis_server import RedisServer, wait_until
from tests.support.workers import WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


class Routed(Cluster):
    """A cluster whose agents run on ``AGENTQ_TEST_QUEUE``, not the default queue."""

    def __init__(self, broker: str, server: RedisServer, log_dir: Path) -> None:
        super().__init__(broker, server, log_dir)
        self.queue = self.env["AGENTQ_TEST_QUEUE"]
        self.default_queue = f"{self.queue}-default"
        self.env["AGENTQ_TEST_DEFAULT_QUEUE"] = self.default_queue
        self.app.conf.task_default_queue = self.default_queue

    def default_worker(self) -> WorkerProcess:
        env = {**self.env, "AGENTQ_TEST_QUEUE": self.default_queue}
        worker = WorkerProcess(self.app, env, self.log_dir).start()
        self.workers.append(worker)
        return worker

    def pending_on_default_queue(self) -> int:
        with self.app.connection_for_write() as conn, conn.channel() as channel:
            try:
                return int(channel.queue_declare(self.default_queue, passive=True).message_count)
            except Exception:  # never declared: nothing was ever sent there
                return 0


@pytest.fixture(params=list(BROKERS))
def routed(
    request: pytest.FixtureRequest, redis_server: RedisServer, tmp_path: Path
) -> Iterator[Routed]:
    broker: str = request.getfixturevalue(BROKERS[request.param])
    env = Routed(broker, redis_server, tmp_path)
    try:
        yield env
    finally:
        env.close()


@pytest.mark.parametrize("stop", ["SIGKILL", "SIGTERM"])
def test_a_routed_thread_goes_back_to_its_queue(routed: Routed, stop: str) -> None:
    agent = routed.agent("counting_agent")
    bystander = routed.default_worker()
    first = routed.worker()
    agent.apply_async(("t1",), {"n": 8, "slow": 0.5}, queue=routed.queue, time_limit=300)
    wait_until(lambda: agent.thread("t1").step >= 1, timeout=30, what="a step")
    if stop == "SIGKILL":
        first.kill()  # recovery sends it, from whichever worker's sweeper leads
    else:
        first.terminate()  # the worker hands it over as it leaves
        first.wait_exit(timeout=30)
    routed.worker()
    assert agent.wait("t1", timeout=60) == 8
    assert routed.pending_on_default_queue() == 0
    assert "tests.counting_agent[" not in bystander.log.read_text(errors="replace")
