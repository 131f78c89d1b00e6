"""A thread's slot moved to another node while its driver writes (MOVED and ASK
redirections, TRYAGAIN while its keys stand on two nodes): every write lands once the
slot settles, where the next read finds it."""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import redis

from agentq.records import Checkpoint, ClaimOutcome
from agentq.store.contract import Renewal
from agentq.store.redis.store import RedisStore
from tests.support.redis_server import RedisServer, running_cluster, wait_until

pytestmark = pytest.mark.cluster

T = TypeVar("T")
TTL = 30.0
THREAD = "resharded"


def checkpoint(step: int, token: int) -> Checkpoint:
    return Checkpoint(
        step=step, node="n", state={"n": step}, pending=[], cursors={}, task="a", token=token
    )


class Driver(threading.Thread):
    """Commits steps, renews the lease and records an effect per step, each call tried
    again on a transient error as a worker's driver does; stops at any other error."""

    def __init__(self, store: RedisStore, token: int) -> None:
        super().__init__(daemon=True)
        self.store, self.token = store, token
        self.steps = 0
        self.tries = 0
        """Calls begun, each try counted."""
        self.transient: collections.Counter[str] = collections.Counter()
        self.failure: BaseException | None = None
        self.halt = threading.Event()

    def call(self, operation: Callable[[], T]) -> T:
        while True:
            self.tries += 1
            try:
                return operation()
            except redis.RedisError as exc:
                if not self.store.is_transient(exc) or self.halt.is_set():
                    raise
                self.transient[type(exc).__name__] += 1

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                self.step(self.steps)
                self.steps += 1
        except BaseException as exc:
            self.failure = exc

    def step(self, step: int) -> None:
        store, token, key = self.store, self.token, f"mail-{step}"
        self.call(lambda: store.commit(THREAD, token, checkpoint(step, token)))
        self.call(lambda: store.renew_many([Renewal(THREAD, "w1", token, TTL)]))
        claim = self.call(lambda: store.claim_effect(THREAD, key, token))
        assert claim.outcome is ClaimOutcome.CLAIMED, claim
        self.call(lambda: store.complete_effect(THREAD, key, token, step))


@contextlib.contextmanager
def admins(nodes: list[RedisServer]) -> Iterator[dict[int, redis.Redis]]:
    clients = {node.port: redis.Redis(port=node.port) for node in nodes}
    try:
        yield clients
    finally:
        for client in clients.values():
            client.close()


def move_slot(
    admin: dict[int, redis.Redis], slot: int, source: int, target: int, driver: Driver
) -> None:
    """Move ``slot`` as ``redis-cli --cluster reshard`` does, a key at a time, each move
    once the driver has tried a call since the last, so that it meets the slot half moved."""
    ids = {port: client.execute_command("CLUSTER MYID").decode() for port, client in admin.items()}
    admin[target].execute_command("CLUSTER SETSLOT", slot, "IMPORTING", ids[source])
    admin[source].execute_command("CLUSTER SETSLOT", slot, "MIGRATING", ids[target])
    while keys := admin[source].execute_command("CLUSTER GETKEYSINSLOT", slot, 1):
        admin[source].execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
        tried = driver.tries
        wait_until(
            lambda tried=tried: driver.failure or driver.tries > tried,
            timeout=30,
            what="a call of the driver's on the half-moved slot",
        )
    for client in admin.values():
        client.execute_command("CLUSTER SETSLOT", slot, "NODE", ids[target])


def slot_owner(admin: redis.Redis, slot: int) -> int:
    for first, last, primary, *_ in admin.execute_command("CLUSTER SLOTS"):
        if first <= slot <= last:
            return int(primary[1])
    raise AssertionError(f"slot {slot} is served by no node")


def test_a_threads_slot_moved_while_it_commits_loses_and_repeats_nothing(
    tmp_path: Path,
) -> None:
    with (
        running_cluster(tmp_path / "cluster") as nodes,
        admins(nodes) as admin,
        RedisStore.from_url(
            f"redis://127.0.0.1:{nodes[0].port}/0", cluster=True, keep_last=5
        ) as store,
    ):
        store.open_thread(THREAD, task="a")
        token = store.acquire(THREAD, "w1", TTL)
        slot = store.client.keyslot(store.keys.meta(THREAD))
        driver = Driver(store, token)
        driver.start()
        try:
            for _ in range(2):  # away and back
                source = slot_owner(admin[nodes[0].port], slot)
                target = next(port for port in admin if port != source)
                before = driver.steps
                move_slot(admin, slot, source, target, driver)
                wait_until(
                    lambda before=before: driver.failure or driver.steps >= before + 10,
                    timeout=30,
                    what="steps committed on the slot's new node",
                )
        finally:
            driver.halt.set()
            driver.join(timeout=30)
        assert driver.failure is None, driver.failure
        assert driver.transient  # it met the slot half moved (TRYAGAIN, as ClusterError)
        steps = driver.steps
        assert store.latest(THREAD) == checkpoint(steps - 1, token)
        meta = store.meta(THREAD)
        assert meta is not None and meta.step == steps - 1
        assert [c.step for c in store.history(THREAD)] == list(range(steps - 1, steps - 6, -1))
        for step in range(steps):
            claim = store.claim_effect(THREAD, f"mail-{step}", token)
            assert (claim.outcome, claim.effect.result) == (ClaimOutcome.DONE, step)
