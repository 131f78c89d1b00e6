"""What a concurrency key costs a thread at the store: the lease cycle of a task run
(acquire, release) with the key's enter and leave in between, against the bare cycle, and
a new thread opened, leased and parked behind 1000 threads waiting on its key.

Run from the repository root::

    python -m bench.thread_keys [--quick]

One private ``redis-server`` (see :mod:`bench.store`); the timings alternate in blocks
as in :mod:`bench.store`. ``ratio thread_key_cycle_over_lease_cycle``: a keyed run's
store work ÷ an unkeyed one's; ``ratio thread_key_park_1000_over_lease_cycle``: opening,
leasing and parking a thread behind 1000 others ÷ the bare cycle (one round trip more).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import redis

from agentq.store.redis.store import RedisStore
from bench._redis import PrivateRedis
from bench._report import Result, exit_with, median, micros, standalone
from bench.store import BLOCK, interleaved

TTL = 3600.0


def _opened(store: RedisStore, thread_id: str) -> str:
    store.open_thread(thread_id, task="bench")
    return thread_id


def _bare(store: RedisStore) -> Callable[[], None]:
    thread_id = _opened(store, "bare")

    def cycle() -> None:
        store.release(thread_id, "bench", store.acquire(thread_id, "bench", TTL))

    return cycle


def _keyed(store: RedisStore) -> Callable[[], None]:
    thread_id = _opened(store, "keyed")

    def cycle() -> None:
        token = store.acquire(thread_id, "bench", TTL)
        store.enter_key(thread_id, "bench", token, "tenant:free", 1)
        store.leave_key(thread_id, token, "tenant:free", start_grace=30)
        store.release(thread_id, "bench", token)

    return cycle


def _parking(store: RedisStore, waiting: int) -> Callable[[], None]:
    holder = _opened(store, "holder")
    store.enter_key(holder, "bench", store.acquire(holder, "bench", TTL), "tenant:full", 1)
    for i in range(waiting):
        parked = _opened(store, f"parked-{i}")
        store.enter_key(parked, "bench", store.acquire(parked, "bench", TTL), "tenant:full", 1)
    names = (f"late-{i}" for i in itertools.count())

    def park() -> None:  # a new thread each time: each parks at the end of the queue
        thread_id = _opened(store, next(names))
        store.enter_key(
            thread_id, "bench", store.acquire(thread_id, "bench", TTL), "tenant:full", 1
        )

    return park


def run(quick: bool) -> list[Result]:
    samples, warmup = (300, 50) if quick else (3000, 300)
    results = []
    with PrivateRedis() as server:
        client = redis.Redis(port=server.port)
        try:
            store = RedisStore(client)
            rows = (
                (
                    "thread_key_cycle_over_lease_cycle",
                    "keyed run ÷ unkeyed, at the store",
                    _keyed(store),
                ),
                (
                    "thread_key_park_1000_over_lease_cycle",
                    "open, lease, park behind 1000 ÷ unkeyed run",
                    _parking(store, 1000),
                ),
            )
            bare = _bare(store)
            for name, what, subject in rows:
                base_ns, subject_ns = interleaved(bare, subject, samples, warmup, BLOCK)
                base, measured = median(base_ns) / 1e9, median(subject_ns) / 1e9
                results.append(
                    Result("ratio", name, measured / base, what, micros(measured), micros(base))
                )
        finally:
            client.close()
    return results


def main(argv: list[str] | None = None) -> int:
    return standalone("python -m bench.thread_keys", __doc__, run, argv)


if __name__ == "__main__":
    exit_with(main)
