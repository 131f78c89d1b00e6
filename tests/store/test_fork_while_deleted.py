"""A fork on Redis reads its source in several round trips (no script may read one thread
and write another on Cluster): a source deleted between them must refuse the fork, not
leave one whose checkpoint cannot be read."""

from __future__ import annotations

from typing import Any

import pytest

from agentq.errors import ThreadNotFound
from agentq.records import Checkpoint, Status
from agentq.store.redis.store import RedisStore
from tests.support.redis_server import RedisServer


def test_a_source_deleted_while_its_logs_are_read_refuses_the_fork(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with (
        RedisStore.from_url(redis_server.url, prefix="forkgc:") as store,
        RedisStore.from_url(redis_server.url, prefix="forkgc:") as operator,
    ):
        store.open_thread("src", task="agent")
        token = store.acquire("src", "w1", 30)
        messages: list[str] = []
        for step in range(2):
            messages = [*messages, f"message {step}"]
            store.commit(
                "src",
                token,
                Checkpoint(step=step, node="n", state={"log": messages}, task="agent", token=token),
                status=Status.RUNNING,
                due_in=30,
                logs={"log": len(messages) - 1},
            )
        read_log = store.client.lrange

        def gc_between_reads(*args: Any, **kwargs: Any) -> Any:
            operator.delete_thread("src")  # as another process's `agentq gc` would
            return read_log(*args, **kwargs)

        monkeypatch.setattr(store.client, "lrange", gc_between_reads)
        with pytest.raises(ThreadNotFound, match="deleted while its checkpoint was being read"):
            store.fork("src", 1, "fork")
        assert store.meta("fork") is None
        assert store.client.keys("forkgc:*") == []
