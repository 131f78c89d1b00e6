"""What the commit's encoding costs: hiredis' ``pack_command`` (what the store uses)
against redis-py's ``pack_commands``, and the pooled commit against one driven through a
redis-py transactional pipeline, at 1/10/100 KB.

Run from the repository root::

    python -m bench.wire [--quick]

Encoding: the commands of one real commit at each size (captured from the store as it
sends them: the commit script with the snapshot as an argument up to
``INLINE_SNAPSHOT_BYTES``, else ``MULTI``/``SET``/``EVALSHA``/``EXEC``), packed into one
buffer again and again by each encoder, no server involved: CPU time only.
``ratio commit_<size>_hiredis_over_pack_commands`` below 1 means hiredis is faster.

Round trip: one private ``redis-server`` (see :mod:`bench.store`) serves two stores, a
plain client (commands packed as above on a pooled connection) and a single-connection
client (which the store drives through a redis-py pipeline), each committing to its own
thread, the timings alternating in blocks as in :mod:`bench.store`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

from agentq.store.contract import UNSET
from agentq.store.redis import checkpoints, wire
from agentq.store.redis.store import RedisStore
from bench._redis import PrivateRedis
from bench._report import Result, exit_with, median, micros, standalone
from bench.store import BLOCK, SIZES, _checkpoint, build_state, interleaved


def _committer(client: redis.Redis, thread_id: str, size: int) -> Callable[[], None]:
    store = RedisStore(client)
    store.open_thread(thread_id, task="bench")
    token = store.acquire(thread_id, "bench", ttl=3600)
    state = build_state(size, thread_id, token)
    step = -1

    def commit() -> None:
        nonlocal step
        step += 1
        store.commit(thread_id, token, _checkpoint(state, step, token), due_in=UNSET)

    return commit


def _commands_of(commit: Callable[[], None]) -> list[Sequence[Any]]:
    """The commands one call of ``commit`` sends, MULTI and EXEC included."""
    sent: list[Sequence[Any]] = []
    real = wire.send

    def capture(client: Any, commands: Sequence[Any], *, transaction: bool) -> list[Any]:
        sent.extend([("MULTI",), *commands, ("EXEC",)] if transaction else commands)
        return real(client, commands, transaction=transaction)

    wire.send = capture  # run_script looks send up in its module at each call
    try:
        commit()
    finally:
        wire.send = real
    return sent


def _cpu_per_call(
    pack: Callable[[Sequence[Sequence[Any]]], object], commands: Sequence[Sequence[Any]], calls: int
) -> float:
    """Seconds of CPU per ``pack(commands)``, the best of five runs of ``calls``."""
    best = float("inf")
    for _ in range(5):
        started = time.process_time()
        for _ in range(calls):
            pack(commands)
        best = min(best, (time.process_time() - started) / calls)
    return best


def run(quick: bool) -> list[Result]:
    samples, warmup, calls = (300, 50, 200) if quick else (3000, 300, 2000)
    results = []
    connection = redis.Connection()  # only packs: never connected

    def redis_py(commands: Sequence[Sequence[Any]]) -> bytes:
        return b"".join(connection.pack_commands(commands))  # as the store joined them

    with PrivateRedis() as server:
        clients: dict[str, redis.Redis] = {
            "pooled": redis.Redis(port=server.port),
            "pipeline": redis.Redis(port=server.port, single_connection_client=True),
        }
        try:
            for label, size in SIZES:
                commits = {
                    way: _committer(client, f"wire-{way}-{label}", size)
                    for way, client in clients.items()
                }
                commands = _commands_of(commits["pooled"])
                ours = _cpu_per_call(functools.partial(wire.pack, connection), commands, calls)
                theirs = _cpu_per_call(redis_py, commands, calls)
                inline = size <= checkpoints.INLINE_SNAPSHOT_BYTES
                results.append(
                    Result(
                        "ratio",
                        f"commit_{label}_hiredis_over_pack_commands",
                        ours / theirs,
                        f"encoding a commit ({'one command' if inline else 'staged'}), "
                        f"hiredis ÷ pack_commands, {label}",
                        micros(ours),
                        micros(theirs),
                    )
                )
                base_ns, way_ns = interleaved(
                    commits["pooled"], commits["pipeline"], samples, warmup, BLOCK
                )
                base, measured = median(base_ns) / 1e9, median(way_ns) / 1e9
                results.append(
                    Result(
                        "ratio",
                        f"commit_{label}_pipeline_over_pooled",
                        measured / base,
                        f"commit via a redis-py pipeline ÷ pooled, {label}",
                        micros(measured),
                        micros(base),
                    )
                )
        finally:
            for client in clients.values():
                client.close()
    return results


def main(argv: list[str] | None = None) -> int:
    return standalone("python -m bench.wire", __doc__, run, argv)


if __name__ == "__main__":
    exit_with(main)
