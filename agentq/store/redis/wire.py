"""Several commands in one round trip, their replies (error replies in place) back.

On a plain client the commands go out on a pooled connection, encoded by hiredis'
``pack_command`` (the same bytes as redis-py's ``pack_commands``, which first encodes
every argument in Python: about five times the time for a commit's thirty arguments); a
redis-py pipeline object costs about as much client time as a small ``GET``
(``python -m bench --only wire`` measures both).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import hiredis
import redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError, ResponseError
from redis.typing import EncodableT, ScriptTextT

RedisClient = redis.Redis | RedisCluster
Command = Sequence[EncodableT]


def pack(connection: Any, commands: Sequence[Command]) -> bytes:
    """``commands`` in the Redis protocol, as one buffer: one write, where
    ``pack_commands`` keeps a large argument (a snapshot) as a chunk of its own, each chunk
    a system call. hiredis encodes text as strict UTF-8, as a connection does by default."""
    encoder = connection.encoder
    if encoder.encoding.lower().replace("-", "") == "utf8" and encoder.encoding_errors == "strict":
        try:
            # The stub types the argument as a 1-tuple; any length is packed.
            return b"".join([hiredis.pack_command(tuple(c)) for c in commands])  # type: ignore[arg-type]
        except TypeError:  # a bytearray argument, which only redis-py encodes
            pass
    return b"".join(connection.pack_commands(commands))


def _exchange(connection: Any, commands: Sequence[Command]) -> list[Any]:
    """Write ``commands`` and read one reply each, error replies as exceptions in place."""
    connection.send_packed_command([pack(connection, commands)])
    replies: list[Any] = []
    for _ in commands:
        try:
            replies.append(connection.read_response())
        except ResponseError as error:
            replies.append(error)
    return replies


def pooled(client: RedisClient) -> bool:
    """True for a client whose connections :func:`send` may take from its pool: cluster
    clients route by slot and single-connection clients share one socket under a lock."""
    return isinstance(client, redis.Redis) and getattr(client, "connection", None) is None


def send(client: RedisClient, commands: Sequence[Command], *, transaction: bool) -> list[Any]:
    """Run ``commands`` in one round trip, in ``MULTI``/``EXEC`` with ``transaction``;
    return their raw replies, error replies as exceptions in their place.

    Retries on connection errors as redis-py does; every caller's commands are safe to
    resend.
    """
    if not pooled(client) or not isinstance(client, redis.Redis):
        pipe = client.pipeline(transaction=transaction)
        for command in commands:
            pipe.execute_command(*command)
        return pipe.execute(raise_on_error=False)
    framed = [("MULTI",), *commands, ("EXEC",)] if transaction else commands
    pool = client.connection_pool
    connection: Any = pool.get_connection()
    try:
        replies: list[Any] = connection.retry.call_with_retry(
            lambda: _exchange(connection, framed),
            lambda _error: connection.disconnect(),
        )
    finally:
        pool.release(connection)
    if not transaction:
        return replies
    # MULTI's OK, a QUEUED per command, EXEC's array. A command refused while queued
    # shows in place of its QUEUED, and aborts the EXEC: report that command's error.
    executed = replies[-1]
    if isinstance(executed, ResponseError):
        raise next((r for r in replies[1:-1] if isinstance(r, ResponseError)), executed)
    if not isinstance(executed, list):
        raise ResponseError(f"EXEC answered {executed!r}")
    return executed


def run_script(
    client: RedisClient,
    sha: str,
    source: ScriptTextT,
    keys: Sequence[str],
    args: Sequence[EncodableT],
    *,
    stage: tuple[str, bytes] | None = None,
) -> Any:
    """``EVALSHA`` the script in one round trip, without redis-py's per-command machinery;
    its reply as the parser gives it.
    With ``stage`` (a key and its bytes): ``MULTI``, ``SET`` the bytes to that key,
    ``EVALSHA``, ``EXEC``, so that a large value never passes through Lua (the script
    moves it into place or deletes it). A server that lost the script gets it loaded, then
    the whole call again (a staged key is simply overwritten)."""
    run = ("EVALSHA", sha, len(keys), *keys, *args)
    commands: list[Command] = [run] if stage is None else [("SET", *stage), run]
    for attempt in range(2):
        *staged, reply = send(client, commands, transaction=stage is not None)
        if staged and isinstance(staged[0], Exception):
            raise staged[0]
        if isinstance(reply, NoScriptError) and attempt == 0:
            client.script_load(source)
            continue
        if isinstance(reply, Exception):
            raise reply
        return reply
    raise AssertionError("unreachable")
