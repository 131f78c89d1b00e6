"""Per-step cost against conversation length: a step that appends a model reply and a tool
result (about 300 B each) to a thread of 10, 100 and 1000 messages.

Run from the repository root::

    python -m bench.steps [--quick]

A step here is what the driver does after a node returns: the append-only check
(``AppendOnlyFields.lengths``), ``store.commit(..., logs={"messages": n})`` and
``AppendOnlyFields.committed``. It is timed with ``perf_counter_ns``; the bytes it writes are
the growth of the private ``redis-server``'s AOF (``INFO persistence`` ``aof_current_size``,
automatic rewrites off, ``appendfsync always``): what reaches the disk, keys, Lua effects,
index updates and pruning included. Read around each block of steps, outside the timing.

So that a "1000-message" step really runs at about 1000 messages, each thread takes only
``max(1, n // 10)`` steps and the next block moves on to a fresh thread grown to ``n``
beforehand. The three lengths alternate in blocks, so drift in the machine lands on all.
The same is measured without append-only fields (every step rewrites the whole state), for
contrast. Targets (printed, not asserted): latency at 1000 ≤ 1.5 x latency at 10; AOF bytes
per step ≤ 1.5 x the encoded bytes of the two new messages.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import redis

from agentq.engine.append_only import AppendOnlyFields
from agentq.records import Checkpoint
from agentq.store.contract import UNSET
from agentq.store.redis.store import RedisStore
from bench import _chat
from bench._redis import PrivateRedis
from bench._report import Result, Target, exit_with, median, micros, quantile, size, standalone

LENGTHS = (10, 100, 1000)
TARGET_LATENCY = Target(1.5)
TARGET_BYTES = Target(1.5)
BLOCK = 10
SAMPLES = {False: 1500, True: 200}
"""Steps per length, append-only; the full-rewrite contrast takes a third (its AOF grows by
the whole state every step: 1500 steps at 1000 messages would write half a gigabyte)."""


@dataclass
class Thread:
    """One thread grown to its length, taking steps that each append a round."""

    store: RedisStore
    thread_id: str
    append_only: bool
    state: dict[str, Any]
    token: int = 0
    step: int = 0
    logs: AppendOnlyFields | None = None

    @classmethod
    def grown(cls, store: RedisStore, thread_id: str, n: int, append_only: bool) -> Thread:
        thread = cls(store, thread_id, append_only, {"messages": _chat.conversation(n)})
        store.open_thread(thread_id, task="bench")
        thread.token = store.acquire(thread_id, "bench", ttl=3600)
        store.commit(
            thread_id,
            thread.token,
            thread._checkpoint(),
            due_in=3600,
            logs={"messages": 0} if append_only else None,
        )
        if append_only:
            thread.logs = AppendOnlyFields(
                thread_id, ("messages",), thread.state, logged=("messages",)
            )
        return thread

    def _checkpoint(self) -> Checkpoint:
        return Checkpoint(
            step=self.step,
            node="model",
            state=self.state,
            task="bench",
            token=self.token,
            created_at=time.time(),
        )

    def append_round(self) -> int:
        """What the nodes did: a reply and a tool result; returns their encoded bytes."""
        i = len(self.state["messages"])
        new = [_chat.reply(i), _chat.tool_result(i)]
        self.state["messages"].extend(new)
        return sum(_chat.encoded_size(m) for m in new)

    def commit(self) -> int:
        """What the driver does once a node returned; returns the nanoseconds of its
        append-only check (the one part that reads the whole field)."""
        self.step += 1
        start = time.perf_counter_ns()
        logs = self.logs.lengths(self.step, self.state) if self.logs is not None else None
        check = time.perf_counter_ns() - start
        self.store.commit(self.thread_id, self.token, self._checkpoint(), due_in=UNSET, logs=logs)
        if self.logs is not None:
            self.logs.committed(self.state)
        return check


@dataclass
class Length:
    """The samples of one conversation length."""

    n: int
    threads: Iterator[Thread]
    ns: list[int] = field(default_factory=list)
    check_ns: list[int] = field(default_factory=list)
    aof_bytes: int = 0
    new_bytes: int = 0
    current: Thread | None = None
    left: int = 0

    def next_thread(self) -> Thread:
        if self.current is None or self.left == 0:
            self.current, self.left = next(self.threads), max(1, self.n // 10)
        self.left -= 1
        return self.current


def _aof_size(client: redis.Redis) -> int:
    return int(client.info("persistence")["aof_current_size"])


def measure(
    store: RedisStore, client: redis.Redis, append_only: bool, samples: int
) -> dict[int, Length]:
    mode = "log" if append_only else "full"
    lengths: dict[int, Length] = {}
    for n in LENGTHS:
        per_thread = max(1, n // 10)
        count = -(-(samples + BLOCK) // per_thread)  # a warm-up block, then the samples
        pool = [Thread.grown(store, f"steps-{mode}-{n}-{k}", n, append_only) for k in range(count)]
        lengths[n] = Length(n, iter(pool))
    for length in lengths.values():  # warm-up: one block each, not recorded
        for _ in range(BLOCK):
            thread = length.next_thread()
            thread.append_round()
            thread.commit()
    clock = time.perf_counter_ns
    for turn in itertools.count():
        order = list(lengths.values())
        if turn % 2:
            order.reverse()
        if all(len(length.ns) >= samples for length in order):
            break
        for length in order:
            before = _aof_size(client)
            for _ in range(BLOCK):
                thread = length.next_thread()
                length.new_bytes += thread.append_round()
                start = clock()
                check = thread.commit()
                length.ns.append(clock() - start)
                length.check_ns.append(check)
            length.aof_bytes += _aof_size(client) - before
    return lengths


def _results(lengths: dict[int, Length], append_only: bool) -> list[Result]:
    mode = "append-only" if append_only else "full-rewrite"
    tag = "steps" if append_only else "steps_full"
    short, long_ = lengths[LENGTHS[0]], lengths[LENGTHS[-1]]

    def latency(length: Length) -> str:
        secs = [ns / 1e9 for ns in length.ns]
        return f"{micros(median(secs))} (p99 {micros(quantile(secs, 0.99))}) @{length.n}"

    results = [
        Result(
            "ratio",
            f"{tag}_latency_{long_.n}_over_{short.n}",
            median(long_.ns) / median(short.ns),
            f"{mode} step latency, {long_.n} ÷ {short.n} msgs",
            latency(long_),
            latency(short),
            TARGET_LATENCY if append_only else None,
        )
    ]
    if append_only:
        check = median(long_.check_ns) / 1e3
        results.append(
            Result(
                "figure",
                f"{tag}_check_us_{long_.n}",
                check,
                f"  of which the append-only check (reads all {long_.n}), µs",
                f"{check:.0f} µs",
                f"{median(short.check_ns) / 1e3:.0f} µs @{short.n}",
                None,
                f"{check * 1e3 / median(long_.ns):.0%} of the step",
            )
        )
    shown = LENGTHS if append_only else (LENGTHS[-1],)
    for n in shown:
        length = lengths[n]
        per_step = length.aof_bytes / len(length.ns)
        appended = length.new_bytes / len(length.ns)
        results.append(
            Result(
                "ratio",
                f"{tag}_aof_bytes_over_appended_{n}",
                per_step / appended,
                f"{mode} AOF bytes/step ÷ new msgs' bytes, {n} msgs",
                f"{size(per_step)}/step",
                f"{size(appended)} appended",
                TARGET_BYTES if append_only else None,
            )
        )
    return results


def run(quick: bool) -> list[Result]:
    samples = SAMPLES[quick]
    results: list[Result] = []
    with PrivateRedis("--auto-aof-rewrite-percentage", "0") as server:
        client = server.client()
        try:
            store = RedisStore(client)
            for append_only, count in ((True, samples), (False, max(3 * BLOCK, samples // 3))):
                count -= count % BLOCK
                results += _results(measure(store, client, append_only, count), append_only)
        finally:
            client.close()
    return results


def main(argv: list[str] | None = None) -> int:
    return standalone("python -m bench.steps", __doc__, run, argv)


if __name__ == "__main__":
    exit_with(main)
