"""The lease keeper: one thread per store per process renews every lease it holds."""

from __future__ import annotations

import gc
import logging
import subprocess
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path

import pytest

from agentq.engine.lease import LeaseKeeper, keeper_for
from agentq.errors import LeaseHeld
from agentq.store.contract import Renewal, Store
from agentq.store.redis.store import RedisStore
from agentq.store.sqlite.store import SQLiteStore
from tests.support.redis_server import RedisServer, running_redis, wait_until
from tests.support.workers import ROOT

TTL = 1.5  # beats every 0.5 s: a loaded machine still renews in time


@pytest.fixture(params=["redis", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    backend: Store
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        with RedisStore.from_url(server.url, prefix=f"{request.node.name}:") as backend:
            yield backend
    else:
        with SQLiteStore(tmp_path / "agentq.db") as backend:
            yield backend


def keeper_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "agentq-lease-keeper"]


def acquired(store: Store, count: int) -> list[tuple[str, int]]:
    leases = []
    for n in range(count):
        store.open_thread(f"t{n}", task="agent")
        leases.append((f"t{n}", store.acquire(f"t{n}", "w1", TTL)))
    return leases


def test_one_keeper_renews_every_lease_held(store: Store) -> None:
    keeper = LeaseKeeper(store)
    before = set(keeper_threads())  # other stores' keepers, from earlier tests
    with ExitStack() as held:
        leases = [
            held.enter_context(keeper.hold(t, "w1", token, TTL)) for t, token in acquired(store, 50)
        ]
        (ours,) = set(keeper_threads()) - before
        first = leases[0].renewed_at
        # Three beats and more than a TTL: the leases are alive only if renewed.
        wait_until(lambda: leases[0].renewed_at > first + TTL, timeout=10, what="renewals")
        for lease in leases:
            assert not lease.lost.is_set()
            with pytest.raises(LeaseHeld):
                store.acquire(lease.thread_id, "w2", TTL)
    wait_until(lambda: not ours.is_alive(), timeout=10, what="the idle keeper to stop")


def test_a_keeper_thread_that_could_not_start_is_started_by_the_next_hold(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of threads for a moment (a pids limit): that hold fails, and the next one still
    gets its lease renewed rather than wait for a keeper that never ran."""
    keeper = LeaseKeeper(store)
    (first, token), (second, second_token) = acquired(store, 2)
    start = threading.Thread.start

    def refused(thread: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refused)
    with (
        pytest.raises(RuntimeError, match="can't start new thread"),
        keeper.hold(first, "w1", token, TTL),
    ):
        pass
    monkeypatch.setattr(threading.Thread, "start", start)
    with keeper.hold(second, "w1", second_token, TTL) as lease:
        renewed = lease.renewed_at
        wait_until(lambda: lease.renewed_at > renewed + TTL, timeout=10, what="renewals")
        assert not lease.lost.is_set()


def test_a_refused_renewal_loses_that_lease_alone(store: Store) -> None:
    keeper = LeaseKeeper(store)
    (stolen, stolen_token), *others = acquired(store, 5)
    with ExitStack() as held:
        lost = held.enter_context(keeper.hold(stolen, "w1", stolen_token, TTL))
        kept = [held.enter_context(keeper.hold(t, "w1", token, TTL)) for t, token in others]
        store.release(stolen, "w1", stolen_token)
        store.acquire(stolen, "w2", 30)
        wait_until(lost.lost.is_set, timeout=10, what="the stolen lease to be lost")
        first = kept[0].renewed_at
        wait_until(lambda: kept[0].renewed_at > first, timeout=10, what="a later renewal")
        assert not any(lease.lost.is_set() for lease in kept)


def test_a_lease_its_driver_gave_up_is_dropped_without_a_warning(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """The driver's last write releases the lease while the keeper's renewal of it may be
    on its way: refused, it is no loss to report."""
    caplog.set_level(logging.WARNING, logger="agentq")
    keeper = LeaseKeeper(store)
    (released, released_token), (stolen, stolen_token) = acquired(store, 2)
    with ExitStack() as held:
        given_up = held.enter_context(keeper.hold(released, "w1", released_token, TTL))
        lost = held.enter_context(keeper.hold(stolen, "w1", stolen_token, TTL))
        given_up.releasing = True
        store.release(released, "w1", released_token)
        store.release(stolen, "w1", stolen_token)
        wait_until(given_up.lost.is_set, timeout=10, what="the refused renewal")
        wait_until(lost.lost.is_set, timeout=10, what="the refused renewal")
    warned = [r.getMessage() for r in caplog.records if "lease lost" in r.getMessage()]
    assert warned == [f"thread {stolen}: lease lost (token {stolen_token})"]


def test_a_store_outage_loses_the_leases_once_their_ttl_has_passed(tmp_path: Path) -> None:
    with running_redis(tmp_path / "redis") as server, RedisStore.from_url(server.url) as store:
        keeper = LeaseKeeper(store)
        with ExitStack() as held:
            leases = [
                held.enter_context(keeper.hold(t, "w1", token, TTL))
                for t, token in acquired(store, 3)
            ]
            renewed = leases[0].renewed_at
            wait_until(lambda: leases[0].renewed_at > renewed, timeout=10, what="a renewal")
            server.kill()
            down = leases[0].renewed_at
            wait_until(
                lambda: all(lease.lost.is_set() for lease in leases), timeout=10, what="lost leases"
            )
            # Not before their TTL ran out since the last renewal that reached the store.
            assert time.monotonic() - down >= TTL


def test_a_store_outage_is_logged_a_line_a_beat_without_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agentq.engine.lease")
    with running_redis(tmp_path / "redis") as server, RedisStore.from_url(server.url) as store:
        keeper = LeaseKeeper(store)
        ((thread_id, token),) = acquired(store, 1)
        with keeper.hold(thread_id, "w1", token, TTL):
            server.kill()
            wait_until(lambda: len(failures(caplog)) >= 2, timeout=10, what="two failed beats")
    for record in failures(caplog):
        assert (record.levelno, record.exc_info) == (logging.WARNING, None)
        assert "renewing 1 leases failed (ConnectionError: " in record.getMessage()


def failures(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "leases failed" in r.getMessage()]


def test_keeper_for_gives_one_keeper_per_store(store: Store, tmp_path: Path) -> None:
    assert keeper_for(store) is keeper_for(store)
    with SQLiteStore(tmp_path / "other.db") as other:
        assert keeper_for(other) is not keeper_for(store)


def held_until_renewed(store: Store) -> set[threading.Thread]:
    """Hold a lease through ``store``'s keeper until it is renewed; the keeper's thread."""
    keeper, before = keeper_for(store), set(keeper_threads())
    ((thread_id, token),) = acquired(store, 1)
    with keeper.hold(thread_id, "w1", token, TTL) as lease:
        first = lease.renewed_at
        wait_until(lambda: lease.renewed_at > first, timeout=10, what="a renewal")
        return set(keeper_threads()) - before


def test_a_store_dropped_by_its_owner_is_not_kept_alive_by_its_keeper(tmp_path: Path) -> None:
    """Stores made and dropped in one process (an app per test, a store per job) are not
    kept, with their keepers and clients, by the process's registry of keepers."""
    dropped, ours = [], set()
    for n in range(3):
        with SQLiteStore(tmp_path / f"{n}.db") as store:
            ours |= held_until_renewed(store)
        dropped.append(weakref.ref(store))
    wait_until(
        lambda: not any(t.is_alive() for t in ours), timeout=10, what="the idle keepers to stop"
    )
    del store
    gc.collect()
    assert [ref() for ref in dropped] == [None, None, None]


class AnswersWrongOnce(SQLiteStore):
    """The embedded store, its first batch of renewals answered with one flag too few."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.batches = 0

    def _do_renew_many(self, leases: Sequence[Renewal]) -> list[bool]:
        self.batches += 1
        renewed = super()._do_renew_many(leases)
        return renewed[1:] if self.batches == 1 else renewed


def test_the_keeper_outlives_a_reply_it_cannot_use(tmp_path: Path) -> None:
    with AnswersWrongOnce(tmp_path / "agentq.db") as store:
        keeper = LeaseKeeper(store)
        ((thread_id, token),) = acquired(store, 1)
        with keeper.hold(thread_id, "w1", token, TTL) as lease:
            first = lease.renewed_at
            wait_until(lambda: lease.renewed_at > first, timeout=10, what="a later renewal")
            assert store.batches >= 2
            assert not lease.lost.is_set()


def test_a_greenlet_killed_while_it_starts_the_keeper_leaves_no_lease_renewed(
    redis_server: RedisServer,
) -> None:
    """Under gevent, starting the keeper's thread yields to the hub, where a
    ``revoke(terminate=True)`` (``gevent.kill``) or a hard time limit may stop the
    greenlet: the lease it was adding must not be renewed for good on behalf of nobody,
    which would keep the thread ``running`` (and a cancel unheeded) while the process lives."""
    pytest.importorskip("gevent")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.engine.gevent_keeper_kill_script",
            redis_server.url,
            f"gk{uuid.uuid4().hex[:8]}:",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "killed starting the keeper" in out.stdout, out.stdout + out.stderr
    assert "TAKEN OVER" in out.stdout, out.stdout + out.stderr
