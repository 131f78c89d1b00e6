"""Fixtures for the LangGraph tests: a saver on each agentq store, on real servers."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from redis.cluster import RedisCluster

from agentq.langgraph import AgentqSaver
from agentq.store.contract import Store
from agentq.store.redis.store import RedisStore
from agentq.store.sqlite.store import SQLiteStore
from tests.support.redis_server import RedisServer, running_cluster

_prefixes = itertools.count()

SaverFactory = Callable[[], AgentqSaver]


@pytest.fixture(scope="session")
def langgraph_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RedisServer]]:
    """A 3-node Redis Cluster: a thread's keys must all hash to one slot."""
    with running_cluster(tmp_path_factory.mktemp("lg-cluster")) as servers:
        yield servers


@pytest.fixture(params=["redis", "sqlite"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["redis", "sqlite", pytest.param("cluster", marks=pytest.mark.cluster)])
def store_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(store_backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """An agentq store of its own: a fresh prefix on the session's redis-server or on a
    Redis Cluster, or a new SQLite file."""
    made: Store
    if store_backend == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        made = RedisStore.from_url(server.url, prefix=f"lg{next(_prefixes)}:")
    elif store_backend == "cluster":
        nodes: list[RedisServer] = request.getfixturevalue("langgraph_cluster")
        client = RedisCluster(host="127.0.0.1", port=nodes[0].port)
        made = RedisStore(client, prefix=f"lg{next(_prefixes)}:")
    else:
        made = SQLiteStore(tmp_path / "agentq.db")
    with made:
        yield made


@pytest.fixture
def saver(store: Store) -> Iterator[AgentqSaver]:
    with AgentqSaver(store) as made:
        yield made
