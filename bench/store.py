"""What durability costs on Redis: a fenced checkpoint commit vs a raw ``SET``, a resume
(``latest()``: load + decode) vs a raw ``GET`` and vs a ``GET`` followed by decoding the same
snapshot bytes with ``msgpack.unpackb``, for 1 KB, 10 KB and 100 KB payloads.

Run from the repository root::

    python -m bench.store [--samples N]

One private ``redis-server`` (free port, temp dir, ``--appendonly yes --appendfsync always
--save ""``) is started for the run and stopped by its PID at the end, also on an error or
Ctrl-C. Both sides of every comparison use the same redis-py client (one connection).

Each operation is timed on its own with ``time.perf_counter_ns``. After warm-up, the baseline
and the agentq operation alternate in blocks (A B B A A B ...), so drift in the machine (disk,
CPU frequency, neighbours) lands on both. Commits go to one thread per payload size with
consecutive steps and the default ``keep_last``, so pruning old checkpoints is paid as in
production. The last lines are machine-readable: ``ratio <name> <median ratio>``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import redis

from agentq.codec.envelope import encode_checkpoint
from agentq.records import Checkpoint
from agentq.store.contract import UNSET
from agentq.store.redis.store import RedisStore
from bench._redis import PrivateRedis
from bench._report import cpu_model, quantile, terminate_as_interrupt

SIZES: tuple[tuple[str, int], ...] = (("1k", 1024), ("10k", 10 * 1024), ("100k", 100 * 1024))
TARGET_COMMIT = 1.15
TARGET_RESUME = 1.15
"""Against ``GET`` + decoding the same bytes: what a resume cannot avoid is both."""
TARGET_RESUME_BARE = {"100k": 1.3}
"""Against a bare ``GET``, at 100 KB only: below that the decode is a few microseconds."""
DEFAULT_SAMPLES = 3000
BLOCK = 20
SIZE_TOLERANCE = 0.10

_WORDS = (
    "the",
    "model",
    "calls",
    "a",
    "tool",
    "with",
    "arguments",
    "and",
    "reads",
    "result",
    "before",
    "it",
    "answers",
    "user",
    "question",
    "about",
    "invoice",
    "order",
    "shipment",
    "refund",
    "weather",
    "account",
    "balance",
    "search",
    "query",
    "document",
    "summary",
    "paragraph",
    "citation",
    "source",
    "retry",
    "timeout",
    "context",
    "window",
    "budget",
)


# -- payloads ---------------------------------------------------------------------------------


def _text(rng: random.Random, length: int) -> str:
    words: list[str] = []
    size = 0
    while size < length:
        word = rng.choice(_WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:length]


def _checkpoint(state: dict[str, Any], step: int, token: int) -> Checkpoint:
    return Checkpoint(step=step, node="model", state=state, token=token, task="bench")


def encoded_size(thread_id: str, checkpoint: Checkpoint) -> int:
    return len(encode_checkpoint(thread_id, checkpoint).snapshot)


def build_state(target: int, thread_id: str, token: int) -> dict[str, Any]:
    """A chat-like state (``{"messages": [{"role", "content"}, ...]}``) whose encoded
    checkpoint is as close to ``target`` bytes as the envelope allows."""
    rng = random.Random(target)
    messages: list[dict[str, str]] = []
    state: dict[str, Any] = {"messages": messages}

    def size() -> int:
        return encoded_size(thread_id, _checkpoint(state, 1000, token))

    roles = ("user", "assistant", "tool")
    while size() < target:
        messages.append({"role": roles[len(messages) % 3], "content": _text(rng, 400)})
    for _ in range(8):  # trim the last message; msgpack str headers move by a byte or two
        over = size() - target
        if over == 0:
            break
        last = messages[-1]["content"]
        messages[-1]["content"] = _text(rng, max(1, len(last) - over))
    return state


# -- measurement ------------------------------------------------------------------------------


@dataclass
class Series:
    name: str
    ns: list[int]

    def quantile(self, q: float) -> float:
        return quantile(self.ns, q) / 1000

    @property
    def median(self) -> float:
        return self.quantile(0.5)

    @property
    def p99(self) -> float:
        return self.quantile(0.99)


def interleaved(
    base: Callable[[], object],
    subject: Callable[[], object],
    samples: int,
    warmup: int,
    block: int = BLOCK,
) -> tuple[list[int], list[int]]:
    """Time ``samples`` calls of each, alternating blocks A B B A A B ... after warm-up."""
    for _ in range(warmup):
        base()
        subject()
    timings: tuple[list[int], list[int]] = ([], [])
    funcs = (base, subject)
    clock = time.perf_counter_ns
    turn = 0
    while len(timings[1]) < samples:
        order = (0, 1) if turn % 2 == 0 else (1, 0)
        for which in order:
            func, out = funcs[which], timings[which]
            for _ in range(min(block, samples - len(out))):
                start = clock()
                func()
                out.append(clock() - start)
        turn += 1
    return timings


# -- machine description ----------------------------------------------------------------------


def _filesystem(path: Path) -> str:
    best, kind = "", "?"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and str(path).startswith(parts[1]) and len(parts[1]) > len(best):
                best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


def machine_line(client: redis.Redis, directory: Path) -> str:
    info = client.info("server")
    hiredis = importlib.util.find_spec("hiredis") is not None
    if hiredis:
        import hiredis as hiredis_module  # type: ignore[import-not-found]

        hiredis_text = f"yes ({getattr(hiredis_module, '__version__', '?')})"
    else:
        hiredis_text = "no"
    cores = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    load = " ".join(f"{value:.2f}" for value in os.getloadavg())
    return (
        f"machine: cpu={cpu_model()!r} cores={cores} (usable {usable}) "
        f"python={platform.python_version()} redis-server={info['redis_version']} "
        f"redis-py={redis.__version__} hiredis={hiredis_text} "
        f"aof=always on {_filesystem(directory)} loadavg={load}"
    )


# -- the run ----------------------------------------------------------------------------------


@dataclass
class Row:
    label: str
    base: Series
    subject: Series
    ratio_name: str
    target: float | None

    @property
    def ratio(self) -> float:
        return self.subject.median / self.base.median


def bench_size(
    store: RedisStore,
    client: redis.Redis,
    label: str,
    size: int,
    samples: int,
    warmup: int,
    block: int,
) -> tuple[list[Row], int, dict[str, float]]:
    """The commit row, then the resume rows (against a bare ``GET``, against ``GET`` +
    decode), the encoded size of the checkpoint, and what a commit spends beyond a ``SET``
    (:func:`commit_parts`)."""
    thread_id = f"bench-{label}"
    store.open_thread(thread_id, task="bench")
    token = store.acquire(thread_id, "bench", ttl=3600)
    state = build_state(size, thread_id, token)
    encoded = encoded_size(thread_id, _checkpoint(state, 1000, token))
    if abs(encoded - size) > SIZE_TOLERANCE * size:
        raise RuntimeError(f"encoded checkpoint is {encoded} bytes, not ~{size}")

    blob = random.Random(size).randbytes(size)
    blob_key = f"bench:blob:{label}"
    step = -1

    def raw_set() -> None:
        client.set(blob_key, blob)

    def commit() -> None:
        nonlocal step
        step += 1
        # As the driver commits a step: the due time stays with the lease.
        store.commit(thread_id, token, _checkpoint(state, step, token), due_in=UNSET)

    client.config_resetstat()
    set_ns, commit_ns = interleaved(raw_set, commit, samples, warmup, block)
    parts = commit_parts(client, thread_id, _checkpoint(state, step, token))

    def raw_get() -> None:
        client.get(blob_key)

    def resume() -> None:
        store.latest(thread_id)

    got = client.get(blob_key)
    loaded = store.latest(thread_id)
    assert got == blob and loaded is not None and loaded.step == step and loaded.state == state
    get_ns, latest_ns = interleaved(raw_get, resume, samples, warmup, block)

    snapshot_key = f"bench:snapshot:{label}"
    client.set(snapshot_key, encode_checkpoint(thread_id, loaded).snapshot)

    def get_decode() -> None:
        msgpack.unpackb(client.get(snapshot_key))

    decode_ns, latest_decode_ns = interleaved(get_decode, resume, samples, warmup, block)

    write = Row(
        label,
        Series("SET", set_ns),
        Series("commit", commit_ns),
        f"commit_{label}_over_set",
        TARGET_COMMIT,
    )
    read = Row(
        label,
        Series("GET", get_ns),
        Series("latest", latest_ns),
        f"resume_{label}_over_get",
        TARGET_RESUME_BARE.get(label),
    )
    read_decode = Row(
        label,
        Series("GET+dec", decode_ns),
        Series("latest", latest_decode_ns),
        f"resume_{label}_over_get_decode",
        TARGET_RESUME,
    )
    return [write, read, read_decode], encoded, parts


def commit_parts(client: redis.Redis, thread_id: str, checkpoint: Checkpoint) -> dict[str, float]:
    """Microseconds of a commit that a raw ``SET`` does not spend: encoding the snapshot
    (median of 200, in this process) and the commit script on the server (``INFO
    commandstats``, its own commands included, over the commits since the last reset)."""
    clock = time.perf_counter_ns
    encodes = []
    for _ in range(200):
        start = clock()
        encode_checkpoint(thread_id, checkpoint)
        encodes.append(clock() - start)
    script = client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"]
    return {"encode": quantile(encodes, 0.5) / 1000, "script": float(script)}


def print_table(rows: list[Row], encoded: dict[str, int]) -> None:
    header = (
        f"{'payload':<8} {'op':<8} {'bytes':>7} {'median µs':>10} {'p99 µs':>10} "
        f"{'Δmed µs':>8} {'ratio(med)':>10} {'target':>7}  verdict"
    )
    print(header)
    print("-" * len(header))
    sizes = dict(SIZES)
    for row in rows:
        verdict = "" if row.target is None else "meets" if row.ratio <= row.target else "MISSES"
        target = "" if row.target is None else "≤" + format(row.target, ".2f")
        for series, nbytes, tail in (
            (row.base, sizes[row.label], ""),
            (
                row.subject,
                encoded[row.label],
                f" {row.subject.median - row.base.median:>+8.1f} {row.ratio:>10.2f} "
                f"{target:>7}  {verdict}",
            ),
        ):
            print(
                f"{row.label:<8} {series.name:<8} {nbytes:>7} {series.median:>10.1f} "
                f"{series.p99:>10.1f}{tail}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.store",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--samples",
        type=int,
        default=DEFAULT_SAMPLES,
        help=f"timed operations per op and size (default {DEFAULT_SAMPLES})",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="untimed iterations of each op first (default samples/10, ≥20)",
    )
    parser.add_argument(
        "--block",
        type=int,
        default=BLOCK,
        help=f"operations per block before switching sides (default {BLOCK})",
    )
    args = parser.parse_args(argv)
    if args.samples < 10:
        parser.error("--samples must be at least 10")
    if args.block < 1:
        parser.error("--block must be at least 1")
    warmup = args.warmup if args.warmup is not None else max(20, args.samples // 10)

    started = time.monotonic()
    with terminate_as_interrupt(), PrivateRedis() as server:
        assert server.directory is not None
        client = server.client()
        try:
            print(machine_line(client, server.directory))
            print(
                f"samples={args.samples} per op and size, warm-up={warmup}, "
                f"blocks of {args.block} alternating, one connection, keep_last=default"
            )
            store = RedisStore(client)
            rows: list[Row] = []
            encoded: dict[str, int] = {}
            parts: dict[str, dict[str, float]] = {}
            for label, size in SIZES:
                found, encoded[label], parts[label] = bench_size(
                    store, client, label, size, args.samples, warmup, args.block
                )
                rows += found
            rows.sort(key=lambda row: row.ratio_name.startswith("resume"))
        finally:
            client.close()
    print()
    print_table(rows, encoded)
    print()
    for label, spent in parts.items():
        print(
            f"{label:<8} a commit beyond a SET: encoding {spent['encode']:.1f} µs, "
            f"the script on the server {spent['script']:.1f} µs"
        )
    print(f"elapsed {time.monotonic() - started:.1f} s")
    for row in rows:
        print(f"ratio {row.ratio_name} {row.ratio:.2f}")
    for label, spent in parts.items():
        for part, micros in spent.items():
            print(f"figure commit_{label}_{part}_us {micros:.1f}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; redis-server stopped", file=sys.stderr)
        sys.exit(130)
