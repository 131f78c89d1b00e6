"""Fixtures for the LangGraph tests: a saver on each agentq store, on real servers."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agentq.langgraph import AgentqSaver
from agentq.store.base import Store
from agentq.store.redis import RedisStore
from agentq.store.sqlite import SQLiteStore
from tests.support.redis_server import RedisServer

_prefixes = itertools.count()

SaverFactory = Callable[[], AgentqSaver]


@pytest.fixture(params=["redis", "sqlite"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """An agentq store of its own: a fresh prefix on the session's redis-server, or a new
    SQLite file."""
    made: Store
    if backend == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        made = RedisStore.from_url(server.url, prefix=f"lg{next(_prefixes)}:")
    else:
        made = SQLiteStore(tmp_path / "agentq.db")
    with made:
        yield made


@pytest.fixture
def saver(store: Store) -> Iterator[AgentqSaver]:
    with AgentqSaver(store) as made:
        yield made
