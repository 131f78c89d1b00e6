"""What the commit's encoding costs: redis-py's ``pack_commands`` (what the store uses)
against a hand-written RESP encoder and against a redis-py transactional pipeline, for the
same fenced commit at 1/10/100 KB.

Run from the repository root::

    python -m bench.wire [--quick]

One private ``redis-server`` (see :mod:`bench.store`) serves three stores, each on a client
of its own: a plain client (the store writes ``MULTI``/``SET``/``EVALSHA``/``EXEC`` itself,
encoded by ``Connection.pack_commands``), a client whose connections encode with the
hand-written encoder below, and a single-connection client (which the store drives through
a redis-py pipeline). Each commits to its own thread; the timings alternate in blocks as in
:mod:`bench.store`. ``ratio commit_<size>_<way>_over_pack_commands``: below 1 means that
way is faster than ``pack_commands``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import cast

import redis
from redis.typing import EncodableT

from agentq.store.contract import UNSET
from agentq.store.redis.store import RedisStore
from bench._redis import PrivateRedis
from bench._report import Result, exit_with, median, micros, standalone
from bench.store import BLOCK, SIZES, _checkpoint, build_state, interleaved


def hand_resp(commands: Iterable[Sequence[EncodableT]]) -> bytes:
    """``commands`` in the Redis protocol as one buffer, with exact type checks (bytes
    first): the encoder the commit path used before ``pack_commands`` (whose chunks the
    store joins into one buffer too)."""
    out: list[bytes] = []
    append = out.append
    for command in commands:
        append(b"*%d\r\n" % len(command))
        for arg in command:
            if type(arg) is bytes:
                data = arg
            elif type(arg) is str:
                data = arg.encode()
            elif type(arg) is int:
                data = b"%d" % arg
            else:
                data = repr(arg).encode()
            append(b"$%d\r\n" % len(data))
            append(data)
            append(b"\r\n")
    return b"".join(out)


class HandEncoded(redis.Connection):
    """A connection that packs commands with :func:`hand_resp`."""

    def pack_commands(self, commands: Iterable[Iterable[EncodableT]]) -> list[bytes]:
        # The store hands over tuples and lists: no copy, as before.
        return [hand_resp(cast(Iterable[Sequence[EncodableT]], commands))]


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


def run(quick: bool) -> list[Result]:
    samples, warmup = (300, 50) if quick else (3000, 300)
    results = []
    with PrivateRedis() as server:
        clients: dict[str, redis.Redis] = {
            "pack_commands": redis.Redis(port=server.port),
            "private": redis.Redis(
                connection_pool=redis.ConnectionPool(port=server.port, connection_class=HandEncoded)
            ),
            "pipeline": redis.Redis(port=server.port, single_connection_client=True),
        }
        try:
            for label, size in SIZES:
                commits = {
                    way: _committer(client, f"wire-{way}-{label}", size)
                    for way, client in clients.items()
                }
                for way in ("private", "pipeline"):
                    base_ns, way_ns = interleaved(
                        commits["pack_commands"], commits[way], samples, warmup, BLOCK
                    )
                    base, measured = median(base_ns) / 1e9, median(way_ns) / 1e9
                    results.append(
                        Result(
                            "ratio",
                            f"commit_{label}_{way}_over_pack_commands",
                            measured / base,
                            f"commit via {way} ÷ via pack_commands, {label}",
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
