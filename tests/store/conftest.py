"""The ``store`` fixture: every contract test runs on each backend, on real servers."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.cluster import RedisCluster

from agentq.store.contract import Store
from agentq.store.redis.store import RedisStore
from tests.support.redis_server import RedisServer, running_cluster

_prefixes = itertools.count()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RedisServer]]:
    with running_cluster(tmp_path_factory.mktemp("cluster")) as servers:
        yield servers


def _unique_prefix() -> str:
    # Each test gets keys of its own on the shared server instead of a FLUSHALL.
    return f"t{next(_prefixes)}:"


@pytest.fixture(params=["redis", "sqlite", pytest.param("cluster", marks=pytest.mark.cluster)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    backend: Store
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        backend = RedisStore.from_url(server.url, prefix=_unique_prefix(), keep_last=5)
    elif request.param == "cluster":
        nodes: list[RedisServer] = request.getfixturevalue("redis_cluster")
        client = RedisCluster(host="127.0.0.1", port=nodes[0].port)
        backend = RedisStore(client, prefix=_unique_prefix(), keep_last=5)
    else:
        from agentq.store.sqlite.store import SQLiteStore

        backend = SQLiteStore(tmp_path / "agentq.db", keep_last=5)
    with backend:
        yield backend
