"""A tool call stopped before its tool starts leaves no claim behind: a claim left pending
says the tool may have run, and would stop the thread in ``needs_attention`` for a call
that never did. A limit nothing declares, a lease lost before the call (or while it waits
for its limit) and a worker killed while the call waits for its limit each leave the record
absent, and the next driver makes the call, once."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agentq
from agentq import Done, Run, Status
from agentq.errors import InvalidArgument, LimitError
from agentq.settings import Settings
from agentq.store.redis.store import RedisStore
from tests.support.mailer import ONE_EVERY_2S, Mailer, drive
from tests.support.redis_server import RedisServer, wait_until

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[RedisStore]:
    with RedisStore.from_url(redis_server.url, prefix=f"tc{uuid.uuid4().hex[:8]}:") as made:
        yield made


@pytest.mark.parametrize("asynchronous", [False, True], ids=["tool", "atool"])
def test_a_limit_nothing_declares_leaves_no_claim_and_the_call_runs_once_declared(
    store: RedisStore, asynchronous: bool
) -> None:
    agent = Mailer(store, limit="api", asynchronous=asynchronous)
    store.open_thread("t1", task=agent.name)
    with pytest.raises(InvalidArgument, match="limit='api' needs the limits declared"):
        drive(agent, "t1", store, Settings(store=store))
    assert store.effect("t1", "mail-1") is None
    # The operator declares the limit and retries the thread.
    store.reopen("t1", from_statuses={Status.FAILED}, start_grace=0)
    declared = Settings(store=store, limits=(ONE_EVERY_2S,))
    assert drive(agent, "t1", store, declared) == ["sent to to-1"]
    assert agent.sent() == ["to-1"]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["tool", "atool"])
def test_a_cost_without_a_limit_is_refused_before_the_call_is_claimed(
    store: RedisStore, asynchronous: bool
) -> None:
    """Nothing would take those tokens: the budget the caller meant to count them in
    would not see them."""
    agent = Mailer(store, cost=500, asynchronous=asynchronous)
    store.open_thread("t1", task=agent.name)
    declared = Settings(store=store, limits=(ONE_EVERY_2S,))
    with pytest.raises(LimitError, match="step 0: cost=500 is taken from a limit's tokens"):
        drive(agent, "t1", store, declared)
    assert store.effect("t1", "mail-1") is None
    assert agent.sent() == []


@pytest.mark.parametrize("asynchronous", [False, True], ids=["tool", "atool"])
def test_a_lease_lost_before_the_call_leaves_no_claim_and_the_next_driver_runs_it(
    store: RedisStore, asynchronous: bool
) -> None:
    def lease_runs_out() -> None:
        # The model call outlasted the lease (a paused worker, a store it could not reach),
        # and no other worker has taken the thread over yet.
        if not agent.sent():
            store.client.delete(store.keys.lock("t1"))

    agent = Mailer(store, asynchronous=asynchronous, before=lease_runs_out)
    store.open_thread("t1", task=agent.name)
    settings = Settings(store=store)
    assert drive(agent, "t1", store, settings) is None  # stopped before the tool
    assert agent.sent() == []
    assert store.effect("t1", "mail-1") is None
    agent.before = lambda: None
    assert drive(agent, "t1", store, settings) == ["sent to to-1"]
    assert agent.sent() == ["to-1"]


def test_a_lease_lost_while_the_call_waits_for_its_limit_stops_it_before_the_tool(
    store: RedisStore,
) -> None:
    """The lease is confirmed after the wait, right before the tool, not before the wait."""
    agent = Mailer(store, mails=2, limit="api")
    store.open_thread("t1", task=agent.name)
    settings = Settings(store=store, limits=(ONE_EVERY_2S,), limit_wait=10)
    first = threading.Thread(target=drive, args=(agent, "t1", store, settings))
    first.start()
    try:
        # The second take is granted with its turn reserved: the call waits for it.
        wait_until(lambda: store.limit_takes().get("api") == 2, timeout=30, what="the second take")
        store.client.delete(store.keys.lock("t1"))  # the lease runs out meanwhile
    finally:
        first.join()
    assert agent.sent() == ["to-1"]
    assert store.effect("t1", "mail-2") is None
    assert drive(agent, "t1", store, settings) == ["sent to to-1", "sent to to-2"]
    assert agent.sent() == ["to-1", "to-2"]


def test_a_worker_killed_while_its_call_waits_for_its_limit_leaves_no_claim(
    store: RedisStore, redis_server: RedisServer
) -> None:
    """The second of two calls waits about 2 s in place for its turn; the worker is
    killed meanwhile, and the thread, recovered, sends that mail once."""
    agent = Mailer(store, mails=2, limit="api")
    store.open_thread("t1", task=agent.name)
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.support.mailer", redis_server.url, store.keys.prefix, "t1"],
        cwd=REPO,
        start_new_session=True,
    )
    try:
        # The second take is granted with its turn reserved: the call waits for it.
        wait_until(lambda: store.limit_takes().get("api") == 2, timeout=30, what="the second take")
    finally:
        worker.kill()
        worker.wait()
    assert agent.sent() == ["to-1"]
    assert store.effect("t1", "mail-2") is None
    settings = Settings(store=store, lease_ttl=1, limits=(ONE_EVERY_2S,), limit_wait=10)
    # Left to its driver until the dead worker's lease runs out.
    result = wait_until(
        lambda: drive(agent, "t1", store, settings), timeout=30, what="the thread recovered"
    )
    assert result == ["sent to to-1", "sent to to-2"]
    assert agent.sent() == ["to-1", "to-2"]


class _HeldStore(RedisStore):
    """Holds each call of the method ``hold``, once made, until the test lets it go on."""

    hold: str
    made: threading.Event
    go_on: threading.Event

    def _held(self, name: str, answer: Any) -> Any:
        if name == self.hold:
            self.made.set()
            assert self.go_on.wait(10)
        return answer

    def claim_effect(self, *args: Any, **kwargs: Any) -> Any:
        return self._held("claim_effect", super().claim_effect(*args, **kwargs))

    def take_limits(self, *args: Any, **kwargs: Any) -> Any:
        return self._held("take_limits", super().take_limits(*args, **kwargs))

    def release_limits(self, *args: Any, **kwargs: Any) -> Any:
        return self._held("release_limits", super().release_limits(*args, **kwargs))


class _CancellingMailer(Mailer):
    """Its node starts a mail's call and cancels it while the store holds the call, as
    LangGraph cancels the sibling branches of one that failed."""

    def __init__(self, store: _HeldStore, limit: str | None) -> None:
        super().__init__(store, asynchronous=True, limit=limit)
        self.entry_node = "send_cancelled"
        self.held = store

    async def send_cancelled(self, run: Run) -> Done:
        call = asyncio.create_task(run.atool(self.amail, "to-1", key="mail-1", limit=self.limit))
        assert await asyncio.to_thread(self.held.made.wait, 10)
        call.cancel()
        self.held.go_on.set()
        with pytest.raises(asyncio.CancelledError):
            await call
        return Done("cancelled")


def test_an_atool_cancelled_as_it_gives_its_slot_back_records_what_its_tool_returned(
    redis_server: RedisServer,
) -> None:
    """The tool ran and returned; the cancel came while the call gave its concurrency slot
    back, before its record: the record is written all the same."""
    with _HeldStore.from_url(redis_server.url, prefix=f"tc{uuid.uuid4().hex[:8]}:") as held:
        held.hold, held.made, held.go_on = "release_limits", threading.Event(), threading.Event()
        agent = _CancellingMailer(held, limit="one-at-a-time")
        held.open_thread("t1", task=agent.name)
        settings = Settings(store=held, limits=(agentq.limit("one-at-a-time", concurrency=1),))
        assert drive(agent, "t1", held, settings) == "cancelled"
        assert agent.sent() == ["to-1"]
        effect = held.effect("t1", "mail-1")
        assert effect is not None and effect.state == "done" and effect.result == "sent to to-1"
        assert held.limit_states()["one-at-a-time"].in_flight == 0


@pytest.mark.parametrize("hold", ["claim_effect", "take_limits"])
def test_an_atool_cancelled_before_its_tool_leaves_no_claim_and_gives_its_slot_back(
    redis_server: RedisServer, hold: str
) -> None:
    """The tool never started, so no record may say it might have (the next call of the key
    runs it, rather than stopping the thread in ``needs_attention``), and the concurrency
    slot it took is free for the next call, however far the store's calls had got."""
    with _HeldStore.from_url(redis_server.url, prefix=f"tc{uuid.uuid4().hex[:8]}:") as held:
        held.hold, held.made, held.go_on = hold, threading.Event(), threading.Event()
        agent = _CancellingMailer(held, limit="one-at-a-time")
        held.open_thread("t1", task=agent.name)
        settings = Settings(store=held, limits=(agentq.limit("one-at-a-time", concurrency=1),))
        assert drive(agent, "t1", held, settings) == "cancelled"
        assert agent.sent() == []
        assert held.effect("t1", "mail-1") is None
        assert held.limit_states()["one-at-a-time"].in_flight == 0


def test_a_gevent_time_limit_during_an_atool_leaves_nothing_on_the_loop(
    redis_server: RedisServer,
) -> None:
    """The greenlet stopped while its slot ran the call's store work: the coroutine hears
    that the call ended, rather than wait on agentq's loop for good."""
    pytest.importorskip("gevent")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.engine.gevent_time_limit_script",
            redis_server.url,
            f"gl{uuid.uuid4().hex[:8]}:",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "timed out after ['to-1']" in out.stdout, out.stderr
    assert "LEFT 0" in out.stdout, out.stdout + out.stderr
