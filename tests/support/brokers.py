"""Private brokers for tests, so no test reads or leaves messages on a developer's own
Redis or RabbitMQ.

Redis: one ``redis-server`` per session (no AOF: a broker's messages need not survive it)
with many databases; each test takes a database of its own, so queues, unacked messages
and the fanout channels kombu prefixes with the database number are its alone.
RabbitMQ: a vhost per test, created and deleted around it with ``rabbitmqctl``.
"""

from __future__ import annotations

import contextlib
import itertools
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

from tests.support.redis_server import RedisServer

BROKER_DATABASES = 1024
RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/{vhost}"


class RedisBrokers:
    """Hands out one database of a private broker server per test."""

    def __init__(self, directory: Path) -> None:
        self.server = RedisServer(
            directory, "--databases", str(BROKER_DATABASES), "--appendonly", "no"
        )
        self._numbers = itertools.count(0)

    def start(self) -> RedisBrokers:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    @contextlib.contextmanager
    def database(self) -> Iterator[str]:
        """The URL of a database no other test uses; emptied when the test ends."""
        number = next(self._numbers)
        if number >= BROKER_DATABASES:
            raise RuntimeError(f"more than {BROKER_DATABASES} tests asked for a Redis broker")
        try:
            yield f"redis://127.0.0.1:{self.server.port}/{number}"
        finally:
            with contextlib.closing(self.server.client()) as client:
                client.execute_command("SELECT", number)
                client.flushdb()


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(
        ["rabbitmqctl", "-q", *args], check=True, capture_output=True, text=True, timeout=60
    )


@contextlib.contextmanager
def rabbitmq_vhost() -> Iterator[str]:
    """The URL of a fresh RabbitMQ vhost that guest may use; deleted with its queues after."""
    vhost = f"agentq-test-{uuid.uuid4().hex[:12]}"
    try:
        _rabbitmqctl("add_vhost", vhost)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        raise RuntimeError(f"cannot create a RabbitMQ vhost ({detail}); start RabbitMQ") from exc
    try:
        _rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        yield RABBITMQ_URL.format(vhost=vhost)
    finally:
        _rabbitmqctl("delete_vhost", vhost)
