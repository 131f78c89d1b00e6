"""What the agentq LangGraph saver costs next to LangGraph's own SQLite saver.

Run from the repository root::

    python -m bench.langgraph [--samples N]

A 50-message thread (alternating user and assistant messages of ~300 characters, plus an
unchanged ``plan`` channel) is saved and loaded the way LangGraph does it in a chat loop:
each ``put`` is the next checkpoint, child of the previous one, with a new version of the
``messages`` channel; each ``get_tuple`` loads the thread's latest checkpoint.

Savers, in the same run:

- ``sqlite_saver``: ``langgraph.checkpoint.sqlite.SqliteSaver`` on a file (WAL, the default
  ``synchronous=FULL``), the baseline;
- ``agentq_redis``: ``AgentqSaver`` on a private ``redis-server`` (``appendonly yes``,
  ``appendfsync always``) bound to a lease, i.e. fenced, as a graph task writes;
- ``agentq_sqlite``: ``AgentqSaver`` on agentq's SQLite store (WAL, ``synchronous=FULL``),
  fenced too.

Floors, in the same run and rotation, for the same bytes (one checkpoint as
``SqliteSaver`` serialises it, ~21 KB), each one op: ``raw_set``/``raw_get`` serialise with
LangGraph's serde and ``SET`` on the same Redis server / ``GET`` and deserialise;
``raw_commit``/``raw_select`` do the same with one ``INSERT`` + ``COMMIT`` / one ``SELECT``
on a SQLite file with the same settings. ``raw_set`` is what any saver writing through that
Redis pays at least; ``raw_commit`` is about what ``SqliteSaver`` pays. They are single ops,
not sums, because a call that waits on a socket or a disk gives up the CPU, and on a busy
machine the work after the wait queues for it again.

Each operation is timed on its own with ``time.perf_counter_ns``; after warm-up the savers
take turns in blocks (rotating who goes first), so drift in the machine lands on all of
them. The last lines are machine-readable: ``ratio <name> <median(agentq) / median(sqlite
saver)>`` (below 1: agentq is faster), the floors as ratios over the same baseline, and
``figure`` lines for the Redis server's own time per command (``INFO commandstats``).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.sqlite import SqliteSaver

from agentq.langgraph import AgentqSaver
from agentq.store.redis.store import RedisStore
from agentq.store.sqlite.store import SQLiteStore
from bench._redis import PrivateRedis
from bench._report import quantile

MESSAGES = 50
DEFAULT_SAMPLES = 1000
BLOCK = 20
THREAD = "bench-thread"

_TEXT = (
    "The customer asks whether the refund for order 4411 went through; the tool reports "
    "the payment provider accepted it yesterday and the money should arrive within three "
    "to five business days, so the assistant explains that and offers to follow up. "
)


def messages(n: int) -> list[Any]:
    made: list[Any] = []
    for i in range(n):
        kind = HumanMessage if i % 2 == 0 else AIMessage
        made.append(kind(content=f"{i}: {_TEXT}", id=f"m{i}"))
    return made


@dataclass
class Subject:
    """One saver driven through a chat-like sequence of checkpoints."""

    name: str
    saver: BaseCheckpointSaver[Any]
    parent: Any = None
    version: Any = None

    def __post_init__(self) -> None:
        self.history = messages(MESSAGES)
        self.plan = {"refunds": 1, "policy": "idempotent"}
        first = self.checkpoint()
        versions = {"messages": first["channel_versions"]["messages"], "plan": "1"}
        self.parent = self.saver.put(self.config(), first, self.metadata(), versions)

    def config(self) -> Any:
        if self.parent is not None:
            return self.parent
        return {"configurable": {"thread_id": THREAD, "checkpoint_ns": ""}}

    def metadata(self) -> Any:
        return {"source": "loop", "step": 0, "parents": {}}

    def checkpoint(self) -> Any:
        self.version = self.saver.get_next_version(self.version, None)
        made = empty_checkpoint()
        made["channel_values"] = {"messages": self.history, "plan": self.plan}
        made["channel_versions"] = {"messages": self.version, "plan": "1"}
        return made

    def put(self) -> None:
        cp = self.checkpoint()
        self.parent = self.saver.put(self.parent, cp, self.metadata(), {"messages": self.version})

    def get_tuple(self) -> None:
        got = self.saver.get_tuple({"configurable": {"thread_id": THREAD, "checkpoint_ns": ""}})
        assert got is not None and len(got.checkpoint["channel_values"]["messages"]) == MESSAGES


def rotate(ops: list[Callable[[], None]], samples: int, warmup: int) -> list[list[int]]:
    """Time ``samples`` calls of each op, in blocks whose order rotates every round."""
    for op in ops:
        for _ in range(warmup):
            op()
    timings: list[list[int]] = [[] for _ in ops]
    clock = time.perf_counter_ns
    turn = 0
    while len(timings[0]) < samples:
        order = list(range(len(ops)))
        order = order[turn % len(ops) :] + order[: turn % len(ops)]
        for which in order:
            op, out = ops[which], timings[which]
            for _ in range(min(BLOCK, samples - len(out))):
                start = clock()
                op()
                out.append(clock() - start)
        turn += 1
    return timings


def quantile_us(ns: list[int], q: float) -> float:
    return quantile(ns, q) / 1000


class Floors:
    """The raw operations a saver cannot go below, on the bytes of one checkpoint."""

    def __init__(self, subject: Subject, client: Any, db: sqlite3.Connection) -> None:
        self.serde = subject.saver.serde
        self.checkpoint = subject.checkpoint()
        self.typed = self.serde.dumps_typed(self.checkpoint)
        self.client, self.db = client, db
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE raw (k INTEGER PRIMARY KEY, v BLOB NOT NULL)")
        self.client.set("raw", self.typed[1])
        self.raw_commit()

    def raw_set(self) -> None:
        self.client.set("raw", self.serde.dumps_typed(self.checkpoint)[1])

    def raw_get(self) -> None:
        self.serde.loads_typed((self.typed[0], self.client.get("raw")))

    def raw_commit(self) -> None:
        data = self.serde.dumps_typed(self.checkpoint)[1]
        self.db.execute("BEGIN")
        self.db.execute("INSERT OR REPLACE INTO raw (k, v) VALUES (1, ?)", (data,))
        self.db.execute("COMMIT")

    def raw_select(self) -> None:
        (data,) = self.db.execute("SELECT v FROM raw WHERE k = 1").fetchone()
        self.serde.loads_typed((self.typed[0], data))


def durability(db: sqlite3.Connection) -> str:
    (mode,) = db.execute("PRAGMA journal_mode").fetchone()
    (sync,) = db.execute("PRAGMA synchronous").fetchone()
    return (
        f"journal_mode={mode} synchronous={ {1: 'NORMAL', 2: 'FULL', 3: 'EXTRA'}.get(sync, sync) }"
    )


def server_us(stats: dict[str, Any], command: str) -> float:
    return float(stats.get(f"cmdstat_{command}", {}).get("usec_per_call", 0.0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.langgraph",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--samples",
        type=int,
        default=DEFAULT_SAMPLES,
        help=f"timed calls per saver and op (default {DEFAULT_SAMPLES})",
    )
    args = parser.parse_args(argv)
    warmup = max(20, args.samples // 10)
    directory = Path(tempfile.mkdtemp(prefix="agentq-bench-langgraph-"))
    closers: list[Callable[[], None]] = []
    try:
        with PrivateRedis() as server:
            baseline = sqlite3.connect(directory / "langgraph.db", check_same_thread=False)
            closers.append(baseline.close)
            redis_store = RedisStore(server.client(), prefix="bench:")
            sqlite_store = SQLiteStore(directory / "agentq.db")
            closers += [redis_store.close, sqlite_store.close]
            subjects = [Subject("sqlite_saver", SqliteSaver(baseline))]
            for name, store in (("agentq_redis", redis_store), ("agentq_sqlite", sqlite_store)):
                store.open_thread(THREAD, task="bench")
                token = store.acquire(THREAD, "bench", ttl=3600)
                subjects.append(Subject(name, AgentqSaver(store).bound(THREAD, token)))
            raw_db = sqlite3.connect(directory / "raw.db", isolation_level=None)
            closers.append(raw_db.close)
            floors = Floors(subjects[0], server.client(), raw_db)
            client = server.client()
            client.config_resetstat()
            put_ops = [s.put for s in subjects] + [floors.raw_set, floors.raw_commit]
            puts = rotate(put_ops, args.samples, warmup)
            put_stats = client.info("commandstats")
            client.config_resetstat()
            get_ops = [s.get_tuple for s in subjects] + [floors.raw_get, floors.raw_select]
            gets = rotate(get_ops, args.samples, warmup)
            get_stats = client.info("commandstats")
            info = client.info("server")
            fsync = client.config_get("appendonly", "appendfsync")
            settings = {
                "sqlite_saver": durability(baseline),
                # check() reports any journal or sync setting short of WAL + FULL.
                "agentq_sqlite": "; ".join(f"{f.name}={f.value}" for f in sqlite_store.check())
                or "journal_mode=wal synchronous=FULL",
                "raw sqlite": durability(raw_db),
                "redis": f"appendonly={fsync['appendonly']} appendfsync={fsync['appendfsync']}",
            }
        print(
            f"machine: cpu_count={os.cpu_count()} python={platform.python_version()} "
            f"redis-server={info['redis_version']} disk={directory}"
        )
        print(
            f"thread: {MESSAGES} messages, {args.samples} samples per saver and op, "
            f"{warmup} warm-up; one checkpoint is {len(floors.typed[1])} bytes serialised"
        )
        for name, setting in settings.items():
            print(f"durability {name}: {setting}")
        header = (
            f"{'op':<10} {'saver':<14} {'median µs':>10} {'p95 µs':>10} {'vs sqlite_saver':>16}"
        )
        print(header)
        print("-" * len(header))
        ratios: list[tuple[str, float]] = []
        names = [s.name for s in subjects]
        floor_names = {
            "put": ["raw_set", "raw_commit"],
            "get_tuple": ["raw_get", "raw_select"],
        }
        medians: dict[str, dict[str, float]] = {}
        for op, timings in (("put", puts), ("get_tuple", gets)):
            base = quantile_us(timings[0], 0.5)
            medians[op] = {}
            for name, ns in zip(names + floor_names[op], timings, strict=True):
                median = quantile_us(ns, 0.5)
                medians[op][name] = median
                p95 = quantile_us(ns, 0.95)
                print(f"{op:<10} {name:<14} {median:>10.1f} {p95:>10.1f} {median / base:>16.2f}")
                if name.startswith("agentq_"):
                    backend = name.removeprefix("agentq_")
                    ratios.append((f"{backend}_{op}_over_sqlite_saver", median / base))
        put, get = medians["put"], medians["get_tuple"]
        floors_over_base = {
            "redis_put_floor": put["raw_set"] / put["sqlite_saver"],
            "sqlite_put_floor": put["raw_commit"] / put["sqlite_saver"],
            "redis_get_tuple_floor": get["raw_get"] / get["sqlite_saver"],
            "sqlite_get_tuple_floor": get["raw_select"] / get["sqlite_saver"],
        }
        for name, value in ratios:
            print(f"ratio {name} {value:.3f}")
        for name, value in floors_over_base.items():
            print(f"ratio {name}_over_sqlite_saver {value:.3f}")
        for name, stats, command in (
            ("put_script", put_stats, "evalsha"),
            ("set", put_stats, "set"),
            ("get_script", get_stats, "evalsha"),
            ("get", get_stats, "get"),
        ):
            print(f"figure redis_server_us_{name} {server_us(stats, command):.1f}")
    finally:
        for close in reversed(closers):
            close()
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
