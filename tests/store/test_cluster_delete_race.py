"""On Redis Cluster a delete takes the thread out of the indexes in a second call, after
its script. A thread made again under the same id by another client in between (gc
deleting a finished thread while the app sends the same id again) must keep its entries:
the second call of the old life's delete must not take out the new life's."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from redis.cluster import RedisCluster

from agentq.records import Status
from agentq.store.redis.store import RedisStore
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.cluster

_prefixes = itertools.count()


@pytest.fixture
def stores(redis_cluster: list[RedisServer]) -> Iterator[tuple[RedisStore, RedisStore]]:
    prefix = f"dr{next(_prefixes)}:"
    port = redis_cluster[0].port
    with (
        RedisStore(RedisCluster(host="127.0.0.1", port=port), prefix=prefix) as deleter,
        RedisStore(RedisCluster(host="127.0.0.1", port=port), prefix=prefix) as sender,
    ):
        yield deleter, sender


def test_a_thread_sent_again_between_a_deletes_two_calls_keeps_its_index_entries(
    stores: tuple[RedisStore, RedisStore],
) -> None:
    deleter, sender = stores
    sender.open_thread("t1", task="agent", start_grace=60)
    apply_ops = deleter._apply_index_ops

    def sent_again_in_between(reply: Any) -> None:
        # The delete script has run (the thread is gone); its index call is on its way
        # when the other client sends the same id again, a new thread, indexed at once.
        assert sender.meta("t1") is None
        sender.open_thread("t1", task="agent", start_grace=60)
        apply_ops(reply)

    deleter._apply_index_ops = sent_again_in_between  # type: ignore[method-assign]
    assert deleter.delete_thread("t1")

    meta = sender.meta("t1")
    assert meta is not None and meta.status == Status.QUEUED
    client = sender.client
    # The new thread must be listed and due, or no sweeper ever sends it.
    assert client.zscore(sender.keys.status_index(Status.QUEUED.value), "t1") is not None
    assert client.zscore(sender.keys.due(), "t1") is not None
