"""On Redis Cluster the global indexes follow a thread's change in a second call, to the
node of the ``{index}`` slot. These tests lose that call (a proxy in front of every node
drops it, as a failover of the index node would) or the thread script's own reply, send
the operation again as the caller does after a store error (RetriedCalls for a driver's
writes; a user told to try again), and check that the indexes then say what the meta
says: the thread in its status's index and no other, due exactly when it runs by itself.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from agentq.celery.runtime import runtime_of
from agentq.cli import cli
from agentq.errors import ThreadStateError
from agentq.ops.gc import CHUNK
from agentq.records import Checkpoint, Status
from agentq.store.redis.store import _SYNCED_PAGE, RedisStore
from tests.chaos.flaky_proxy import FlakyProxy
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.cluster

T = TypeVar("T")

TTL = 30.0

_prefixes = itertools.count()


class Faults:
    """A :class:`FlakyProxy` in front of each node of the cluster, the client routed
    through them."""

    def __init__(self, nodes: list[RedisServer]) -> None:
        self.proxies = {node.port: FlakyProxy(node.port) for node in nodes}

    def remap(self, address: tuple[str, int]) -> tuple[str, int]:
        proxy = self.proxies.get(address[1])
        return (address[0], proxy.port) if proxy else address

    def drop(self, data: bytes) -> None:
        """Every request containing ``data`` fails without reaching its node."""
        for proxy in self.proxies.values():
            proxy.drop = data

    def lose_reply(self, data: bytes) -> None:
        """The next request containing ``data`` runs, but its reply never arrives."""
        for proxy in self.proxies.values():
            proxy.lose_reply_to = data

    def heal(self) -> None:
        for proxy in self.proxies.values():
            proxy.drop = proxy.lose_reply_to = None

    def close(self) -> None:
        for proxy in self.proxies.values():
            proxy.close()


@pytest.fixture
def faults(redis_cluster: list[RedisServer]) -> Iterator[Faults]:
    faults = Faults(redis_cluster)
    try:
        yield faults
    finally:
        faults.close()


@pytest.fixture
def store(faults: Faults, redis_cluster: list[RedisServer]) -> Iterator[RedisStore]:
    entry = faults.proxies[redis_cluster[0].port]
    # One retry without backoff: a dropped call fails in milliseconds, not seconds.
    client = RedisCluster(
        host="127.0.0.1", port=entry.port, address_remap=faults.remap, retry=Retry(NoBackoff(), 1)
    )
    with RedisStore(client, prefix=f"ci{next(_prefixes)}:") as store:
        yield store


def sha(store: RedisStore, script: str) -> bytes:
    return store._scripts[script].sha.encode()


def resent(store: RedisStore, faults: Faults, call: Callable[[], T]) -> T:
    """``call()``, which fails with a store error, then again once the store is healed:
    what RetriedCalls does for a driver's writes, and a user for resume or retry."""
    with pytest.raises(Exception) as failed:
        call()
    assert store.is_transient(failed.value), failed.value
    faults.heal()
    return call()


def index_entries(store: RedisStore, thread_id: str) -> tuple[set[Status], float | None]:
    client = store.client
    statuses = {
        status
        for status in Status
        if client.zscore(store.keys.status_index(status.value), thread_id) is not None
    }
    return statuses, client.zscore(store.keys.due(), thread_id)


def assert_indexes_follow_meta(store: RedisStore, thread_id: str) -> float | None:
    """The thread is in its status's index, with its updated_at, and in no other; it is in
    the due index exactly when it runs by itself. Returns its due time."""
    meta = store.meta(thread_id)
    assert meta is not None
    statuses, due = index_entries(store, thread_id)
    assert statuses == {meta.status}
    score = store.client.zscore(store.keys.status_index(meta.status.value), thread_id)
    assert score == pytest.approx(meta.updated_at)
    assert (due is not None) == meta.runs_by_itself, (meta.status, due)
    return due


def running(store: RedisStore, thread_id: str) -> int:
    store.open_thread(thread_id, task="agent", start_grace=60)
    token = store.acquire_to_run(thread_id, "w1", TTL).token
    assert token is not None
    return token


def checkpoint(step: int, token: int) -> Checkpoint:
    return Checkpoint(step=step, node="model", state={"n": step}, token=token, task="agent")


def test_a_commit_to_done_resent_after_its_index_call_failed_leaves_the_indexes(
    store: RedisStore, faults: Faults
) -> None:
    token = running(store, "t1")
    faults.drop(sha(store, "index"))
    resent(
        store,
        faults,
        lambda: store.commit(
            "t1", token, checkpoint(0, token), status=Status.DONE, result=1, release_owner="w1"
        ),
    )
    assert index_entries(store, "t1") == ({Status.DONE}, None)
    assert_indexes_follow_meta(store, "t1")
    assert store.gc(0.0) == 1


def test_a_commit_whose_reply_was_lost_still_moves_the_indexes(
    store: RedisStore, faults: Faults
) -> None:
    token = running(store, "t1")
    faults.lose_reply(sha(store, "commit"))
    # The client sends the script again on a new connection, by itself or through the
    # caller: either way the second run finds the checkpoint already written.
    with contextlib.suppress(Exception):
        store.commit(
            "t1", token, checkpoint(0, token), status=Status.DONE, result=1, release_owner="w1"
        )
    faults.heal()
    store.commit(
        "t1", token, checkpoint(0, token), status=Status.DONE, result=1, release_owner="w1"
    )
    assert sum(proxy.lost for proxy in faults.proxies.values()) == 1
    assert index_entries(store, "t1") == ({Status.DONE}, None)
    assert_indexes_follow_meta(store, "t1")


@pytest.mark.parametrize(
    ("status", "options"),
    [
        (Status.FAILED, {"error": "boom"}),
        (Status.RETRYING, {"due_in": 30.0}),
        (Status.WAITING, {"interrupt": {"ask": "ok?"}, "due_in": 600.0}),
        (Status.WAITING, {"interrupt": {"ask": "ok?"}}),
        (Status.QUEUED, {"due_in": 0.0}),
    ],
)
def test_a_status_change_resent_after_its_index_call_failed_leaves_the_indexes(
    store: RedisStore, faults: Faults, status: Status, options: dict[str, Any]
) -> None:
    token = running(store, "t1")
    faults.drop(sha(store, "index"))
    resent(
        store,
        faults,
        lambda: store.set_status("t1", token, status, release_owner="w1", **options),
    )
    due = assert_indexes_follow_meta(store, "t1")
    meta = store.meta("t1")
    assert meta is not None and meta.status == status
    if status == Status.RETRYING:
        assert due is not None and due > store._now() + 25
    if meta.timeout_at is not None:
        assert due == pytest.approx(meta.timeout_at)


def test_a_reopen_resent_after_its_index_call_failed_makes_the_thread_due(
    store: RedisStore, faults: Faults
) -> None:
    token = running(store, "t1")
    store.set_status("t1", token, Status.FAILED, error="boom", release_owner="w1")
    faults.drop(sha(store, "index"))

    def reopen() -> None:
        store.reopen("t1", from_statuses={Status.FAILED}, start_grace=0)

    # The second try finds the thread queued already and says so; its reply still puts
    # the indexes right.
    with pytest.raises(ThreadStateError):
        resent(store, faults, reopen)
    assert index_entries(store, "t1")[0] == {Status.QUEUED}
    assert assert_indexes_follow_meta(store, "t1") is not None
    assert store.claim_due(hold=60) == ["t1"]


def test_an_open_thread_resent_after_its_index_call_failed_indexes_the_thread(
    store: RedisStore, faults: Faults
) -> None:
    faults.drop(sha(store, "index"))
    _, created = resent(store, faults, lambda: store.open_thread("t1", task="agent"))
    assert not created
    assert index_entries(store, "t1")[0] == {Status.QUEUED}
    assert assert_indexes_follow_meta(store, "t1") is not None
    assert [meta.thread_id for meta in store.threads(Status.QUEUED)] == ["t1"]


def test_a_cancel_resent_after_its_index_call_failed_leaves_the_indexes(
    store: RedisStore, faults: Faults
) -> None:
    store.open_thread("t1", task="agent")
    faults.drop(sha(store, "index"))
    assert resent(store, faults, lambda: store.request_cancel("t1")) == Status.CANCELLED
    assert index_entries(store, "t1") == ({Status.CANCELLED}, None)
    assert_indexes_follow_meta(store, "t1")


def test_a_delete_resent_after_its_index_call_failed_leaves_no_entry(
    store: RedisStore, faults: Faults
) -> None:
    store.open_thread("t1", task="agent")
    faults.drop(sha(store, "index"))
    assert not resent(store, faults, lambda: store.delete_thread("t1"))
    assert index_entries(store, "t1") == (set(), None)


def test_an_older_state_arriving_late_does_not_overwrite_a_newer_one(
    store: RedisStore,
) -> None:
    token = running(store, "t1")
    # The thread's entries while it runs, as a slow client would send them ...
    (older,) = store._scripts["sync_index"](keys=[store.keys.meta("t1")], args=["", "t1"])
    store.set_status("t1", token, Status.FAILED, error="boom", release_owner="w1")
    # ... after the failure's own entries are in place.
    applied = store._scripts["index"](
        keys=[store.keys.due(), store.keys.synced()],
        args=[store.keys.status_index_prefix(), *older],
    )
    assert applied == 0
    assert index_entries(store, "t1") == ({Status.FAILED}, None)


def test_gc_removes_a_waiting_thread_that_a_late_index_call_brought_back(
    store: RedisStore,
) -> None:
    """A waiting thread is due nowhere, so no sweep finds an entry its deletion left: it
    stayed in the status index (and was counted) for good."""
    token = running(store, "t1")
    store.set_status("t1", token, Status.WAITING, release_owner="w1")
    # The wait's entries, as a slow client would send them ...
    (older,) = store._scripts["sync_index"](keys=[store.keys.meta("t1")], args=["", "t1"])
    assert store.delete_thread("t1")
    # ... after the delete's own.
    store._scripts["index"](
        keys=[store.keys.due(), store.keys.synced()],
        args=[store.keys.status_index_prefix(), *older],
    )
    assert store.status_counts()[Status.WAITING] == 1
    store.open_thread("kept", task="agent", start_grace=60)
    assert store.gc(3600) == 0
    assert index_entries(store, "t1") == (set(), None)
    assert store.client.hget(store.keys.synced(), "t1") is None
    assert store.status_counts()[Status.WAITING] == 0
    assert_indexes_follow_meta(store, "kept")


def test_gc_removes_what_a_delete_whose_index_call_was_lost_left(
    store: RedisStore, faults: Faults
) -> None:
    token = running(store, "t1")
    store.set_status("t1", token, Status.WAITING, release_owner="w1")
    faults.drop(sha(store, "index"))
    # The operator's client dies here: nothing sends the delete again.
    with pytest.raises(Exception) as failed:
        store.delete_thread("t1")
    assert store.is_transient(failed.value)
    faults.heal()
    assert index_entries(store, "t1") == ({Status.WAITING}, None)
    assert store.gc(3600) == 0
    assert index_entries(store, "t1") == (set(), None)
    assert store.client.hget(store.keys.synced(), "t1") is None


GONE = 3 * _SYNCED_PAGE
"""More threads left behind in the indexes than one page of the synced hash."""

APP = """
from celery import Celery
from redis.cluster import RedisCluster

import agentq

app = Celery("gc-on-cluster", set_as_current=False)
agentq.init_app(app, store=RedisCluster(host="127.0.0.1", port={port}), prefix={prefix!r})
"""


def left_behind(store: RedisStore, count: int) -> None:
    """``count`` threads that no longer exist, still waiting in their status index and
    with a field in the synced hash: what index calls arriving after their threads'
    deletes leave (see the test above), put in place in one round trip."""
    now = store._now()
    ops = [[f"gone-{n}", Status.WAITING.value, now, "clear", 1] for n in range(count)]
    store._run_many("index", [(store._sync_keys(), store._sync_args(op)) for op in ops])


def test_one_agentq_gc_takes_out_every_entry_left_behind(
    redis_cluster: list[RedisServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``agentq gc`` runs once, in a process of its own: it reads the whole synced hash,
    not only the page of it that each gc call of a worker's sweeper reads."""
    prefix = f"ci{next(_prefixes)}:"
    module = f"gc_on_cluster_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(APP.format(port=redis_cluster[0].port, prefix=prefix))
    monkeypatch.syspath_prepend(str(tmp_path))
    client = RedisCluster(host="127.0.0.1", port=redis_cluster[0].port)
    with RedisStore(client, prefix=prefix) as store:
        left_behind(store, GONE)
        finished = CHUNK + 20  # several gc calls, a chunk each
        for n in range(finished):
            token = running(store, f"done-{n}")
            store.commit(
                f"done-{n}", token, checkpoint(0, token), status=Status.DONE, release_owner="w1"
            )
        store.open_thread("kept", task="agent", start_grace=60)
        assert store.status_counts()[Status.WAITING] == GONE
        try:
            result = CliRunner().invoke(
                cli, ["-A", f"{module}:app", "gc", "--older-than", "0", "--json"]
            )
        finally:
            runtime_of(__import__(module).app).store.close()
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["removed"] == finished
        counts = store.status_counts()
        assert {status for status, count in counts.items() if count} == {Status.QUEUED}
        assert counts[Status.QUEUED] == 1
        assert store.client.hkeys(store.keys.synced()) == [b"kept"]
        assert_indexes_follow_meta(store, "kept")


def test_a_limited_gc_reads_one_page_of_the_synced_hash_a_call(store: RedisStore) -> None:
    """The sweeper's gc (limited, about once a minute) must not read every thread the
    indexes hold each time, as a worker may hold a million: each call reads the next
    page, so that entries left behind go within a few calls."""
    left_behind(store, GONE)
    assert store.gc(3600, limit=100) == 0
    left = [store.status_counts()[Status.WAITING]]
    assert 0 < left[0] < GONE
    while left[-1] and len(left) <= 2 * GONE // _SYNCED_PAGE:
        store.gc(3600, limit=100)
        left.append(store.status_counts()[Status.WAITING])
    assert left[-1] == 0, left


def test_sync_index_repairs_what_a_lost_index_call_left(store: RedisStore, faults: Faults) -> None:
    token = running(store, "t1")
    faults.drop(sha(store, "index"))
    # The worker's client dies here: nothing sends the commit again.
    with pytest.raises(Exception) as failed:
        store.commit(
            "t1", token, checkpoint(0, token), status=Status.DONE, result=1, release_owner="w1"
        )
    assert store.is_transient(failed.value)
    faults.heal()
    assert index_entries(store, "t1")[1] is not None  # the sweeper would find it due
    store.sync_index("t1")
    assert index_entries(store, "t1") == ({Status.DONE}, None)
    store.client.delete(store.keys.meta("t1"))  # the thread gone, its entries not
    store.client.zadd(store.keys.due(), {"t1": 0})
    store.sync_index("t1")
    assert index_entries(store, "t1") == (set(), None)


def test_a_thread_id_created_again_after_a_lost_delete_is_indexed(
    store: RedisStore, faults: Faults
) -> None:
    """The delete's index call lost for good (its client died): the entries of the
    thread's first life stay, with the last state applied for it. The same id, created
    again, still gets its own entries and is due."""
    token = running(store, "t1")
    for step in range(3):  # some changes, so that its first life's count is past 1
        store.commit("t1", token, checkpoint(step, token))
    store.set_status("t1", token, Status.WAITING, release_owner="w1")
    faults.drop(sha(store, "index"))
    with pytest.raises(Exception) as failed:
        store.delete_thread("t1")
    assert store.is_transient(failed.value)
    faults.heal()
    store.open_thread("t1", task="agent", start_grace=60)
    assert index_entries(store, "t1")[1] is not None
    assert_indexes_follow_meta(store, "t1")


@pytest.mark.parametrize("script", ["settle_shared", "resolve_effect"])
@pytest.mark.parametrize("settled", [{"result": "in_1"}, {"did_not_run": True}])
def test_a_shared_record_settled_again_after_a_lost_reply_is_settled_once(
    store: RedisStore, faults: Faults, script: str, settled: dict[str, Any]
) -> None:
    """The shared record and the thread are in two slots, settled in two calls: the
    client resends either call whose reply it lost, and the resend answers as the first
    run did, not "the record is not pending" or "the thread is queued already"."""
    token = running(store, "t1")
    store.claim_effect("t1", "invoice-1", token, shared=True, claim_id="c1")
    store.set_status("t1", token, Status.NEEDS_ATTENTION, error="unknown", release_owner="w1")
    # Loaded already, so that the reply lost is the one of a run, not of a NOSCRIPT.
    store.client.script_load(store._scripts[script].script)
    faults.lose_reply(sha(store, script))
    meta = store.resolve_effect("t1", "invoice-1", shared=True, start_grace=0, **settled)
    assert sum(proxy.lost for proxy in faults.proxies.values()) == 1
    assert (meta.status, meta.fence) == (Status.QUEUED, token + 1)
    effect = store.effect("t1", "invoice-1", shared=True)
    if "result" in settled:
        assert effect is not None and (effect.state, effect.result) == ("done", "in_1")
    else:
        assert effect is None
    assert assert_indexes_follow_meta(store, "t1") is not None
