from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator

import pytest

from tests.support.brokers import RedisBrokers, rabbitmq_vhost
from tests.support.redis_server import RedisServer, running_redis

if shutil.which("redis-server") is None:
    pytest.exit("redis-server is not on PATH; install it (apt-get install redis-server)", 3)

# A run started in the background by a non-interactive shell (`cmd &`, nohup) inherits
# SIGINT ignored, and an ignored signal stays ignored across exec: the commands the tests
# start and interrupt, as a user's Ctrl-C would, would never see it.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


CHAOS_SIZE = {"threads": 30, "steps": 10}


def pytest_addoption(parser: pytest.Parser) -> None:
    # Here rather than in tests/chaos: pytest only asks the conftests it loads at startup,
    # and this one is loaded whichever tests are named.
    group = parser.getgroup("chaos", "agentq chaos test (tests/chaos/test_chaos.py)")
    for name, default in CHAOS_SIZE.items():
        group.addoption(
            f"--chaos-{name}",
            type=int,
            default=None,
            help=f"{name} (default {default}, or $AGENTQ_CHAOS_{name.upper()})",
        )


@pytest.fixture
def chaos_size(request: pytest.FixtureRequest) -> tuple[int, int]:
    """``(threads, steps)`` of the chaos test: CI runs the default, a local run may ask
    for more, e.g. ``pytest tests/chaos --chaos-threads 100 --chaos-steps 12``."""
    threads, steps = (
        request.config.getoption(f"--chaos-{name}")
        or int(os.environ.get(f"AGENTQ_CHAOS_{name.upper()}", default))
        for name, default in CHAOS_SIZE.items()
    )
    return threads, steps


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private redis-server (AOF always) shared by the session; tests use own prefixes."""
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="session")
def redis_brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisBrokers]:
    """A private broker redis-server shared by the session, one database per test."""
    brokers = RedisBrokers(tmp_path_factory.mktemp("broker")).start()
    try:
        yield brokers
    finally:
        brokers.stop()


@pytest.fixture
def redis_broker(redis_brokers: RedisBrokers) -> Iterator[str]:
    """A Redis broker URL (a database of the private broker server) for this test alone."""
    with redis_brokers.database() as url:
        yield url


@pytest.fixture
def result_backend(redis_brokers: RedisBrokers) -> Iterator[str]:
    """A database of the broker server for Celery's results, apart from its messages."""
    with redis_brokers.database() as url:
        yield url


@pytest.fixture
def rabbitmq_broker() -> Iterator[str]:
    """An AMQP URL on a RabbitMQ vhost created for this test and deleted after it."""
    with rabbitmq_vhost() as url:
        yield url
