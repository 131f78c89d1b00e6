from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.support.redis_server import RedisServer, running_redis

if shutil.which("redis-server") is None:
    pytest.exit("redis-server is not on PATH; install it (apt-get install redis-server)", 3)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private redis-server (AOF always) shared by the session; tests use own prefixes."""
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server
