"""The store on Redis and Redis-API servers with Lua (Valkey, KeyDB, Dragonfly, ...).

Every write is one Lua script on the thread's keys (see :mod:`agentq.ids`), so it is
atomic and costs one round trip. On a single server the global indexes change in the
same script; on Redis Cluster they live in another slot and follow in a second call
(see ``lua/_prelude.lua`` for why that ordering is safe).

The two hot paths keep large values out of Lua, where every kilobyte costs time both
ways: ``commit`` sends ``MULTI``, a plain ``SET`` of the snapshot to the thread's staged
key, the commit script (which checks the fence and the step, then renames the staged key
into place) and ``EXEC``, in one write; ``latest`` reads the pointer and the snapshot
it names with one ``MGET`` when it knows the step to expect (from this store's last
commit, ``meta()`` or ``latest()`` of the thread), and falls back to a script otherwise.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Collection, Mapping, Sequence
from importlib.resources import files
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import DataError, NoScriptError, ResponseError

from agentq.codec.envelope import (
    build_checkpoint,
    decode_checkpoint,
    decode_envelope,
    decode_value,
    encode_checkpoint,
    encode_value,
)
from agentq.errors import (
    ArtifactNotFound,
    CheckpointNotFound,
    EffectError,
    LeaseHeld,
    LeaseLost,
    LogConflict,
    StaleToken,
    StepConflict,
    StoreConfigError,
    ThreadExists,
    ThreadNotFound,
    ThreadStateError,
)
from agentq.records import FINISHED, Checkpoint, Claim, Effect, Finding, Status, ThreadMeta
from agentq.settings import DEFAULT_KEEP_LAST, DEFAULT_MAX_CHECKPOINT_BYTES
from agentq.store.contract import (
    UNSET,
    Store,
    _Unset,
    retry_not_due,
)
from agentq.store.meta_fields import meta_from_fields
from agentq.store.redis.graph import RedisGraph
from agentq.store.redis.keys import Keys
from agentq.store.redis.transient import TRANSIENT_ERRORS, is_transient

RedisClient = redis.Redis | RedisCluster
Arg = bytes | str | int | float

MAX_REMEMBERED_HEADS = 10_000
"""How many threads' latest steps a store remembers to read ``latest()`` with one ``MGET``."""

_SCRIPTS = (
    "index",
    "open_thread",
    "acquire",
    "renew",
    "release",
    "commit",
    "set_status",
    "latest",
    "delete_thread",
    "create_fork",
    "claim_effect",
    "complete_effect",
    "claim_due",
    "reopen",
    "request_cancel",
    "put_artifact",
    "lease_sweeper",
    "release_effect",
)


def _load_scripts(client: RedisClient) -> dict[str, Script]:
    lua = files("agentq.store.redis") / "lua"
    prelude = (lua / "_prelude.lua").read_text()
    return {
        name: client.register_script(prelude + (lua / f"{name}.lua").read_text())
        for name in _SCRIPTS
    }


def _resp(commands: Sequence[Sequence[Arg]]) -> bytes:
    """``commands`` in the Redis protocol, as one buffer (one write). Integers in decimal and
    floats as ``repr``, like redis-py."""
    out: list[bytes] = []
    append = out.append
    for command in commands:
        append(b"*%d\r\n" % len(command))
        for arg in command:
            # Exact type checks, bytes first: this runs for every argument of a commit.
            if type(arg) is bytes:
                data = arg
            elif type(arg) is str:
                data = arg.encode()
            elif type(arg) is int:
                data = b"%d" % arg
            else:
                data = _encode_arg(arg)
            append(b"$%d\r\n" % len(data))
            append(data)
            append(b"\r\n")
    return b"".join(out)


def _encode_arg(value: object) -> bytes:
    """An argument of a type :func:`_resp` does not expect first, as redis-py would."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, int) and not isinstance(value, bool):
        return b"%d" % value
    if isinstance(value, float):
        return repr(value).encode()
    raise DataError(f"cannot send a {type(value).__name__} to Redis: {value!r}")


def _exchange(connection: Any, packed: bytes, count: int) -> list[Any]:
    """Write ``packed`` and read ``count`` replies, error replies as exceptions in place."""
    connection.send_packed_command([packed])
    replies: list[Any] = []
    for _ in range(count):
        try:
            replies.append(connection.read_response())
        except ResponseError as error:
            replies.append(error)
    return replies


def _millis(ttl: float) -> int:
    """A lease TTL as the whole milliseconds ``PX`` takes (the contract refused < 1 ms)."""
    return int(ttl * 1000)


def _due_arg(due_in: float | _Unset | None) -> Arg:
    """commit.lua's due argument: seconds, '' to clear, 'keep' to leave it."""
    if isinstance(due_in, _Unset):
        return "keep"
    return "" if due_in is None else due_in


def _log_fields(logs: Mapping[str, int]) -> bytes:
    """The meta's ``log_fields``: the append-only fields of the latest checkpoint."""
    if not logs:
        return b""
    return encode_value(sorted(logs), what="log fields", thread_id=None, step=None)


def _pairs(fields: dict[str, Any]) -> list[Any]:
    return [item for pair in fields.items() for item in pair]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _blob(value: object) -> bytes:
    if not isinstance(value, bytes):  # __init__ refuses decoding clients; this is a bug
        raise StoreConfigError(f"expected bytes from Redis, got {type(value).__name__}")
    return value


def _hash_to_fields(flat: list[bytes]) -> dict[str, bytes]:
    return {flat[i].decode(): flat[i + 1] for i in range(0, len(flat), 2)}


def _fields(record: Any) -> dict[str, bytes]:
    return {_text(k): v for k, v in record.items()}


class RedisStore(Store):
    """Threads in Redis. Construct from a client or with :meth:`from_url`.

    ``client`` must return bytes (``decode_responses=False``, the default). A
    :class:`redis.cluster.RedisCluster` client is used in cluster mode.
    """

    transient_errors = TRANSIENT_ERRORS

    def is_transient(self, exc: BaseException) -> bool:
        return is_transient(exc)

    def __init__(
        self,
        client: RedisClient,
        *,
        prefix: str = "agentq:",
        keep_last: int = DEFAULT_KEEP_LAST,
        max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
    ) -> None:
        super().__init__(keep_last=keep_last, max_checkpoint_bytes=max_checkpoint_bytes)
        if client.get_encoder().decode_responses:
            raise StoreConfigError(
                "the Redis client decodes responses, but checkpoints are binary; create it "
                "with decode_responses=False"
            )
        if "{" in prefix or "}" in prefix:
            raise StoreConfigError(f"prefix {prefix!r} contains a brace; remove it")
        self.client = client
        self.keys = Keys(prefix)
        self.cluster = isinstance(client, RedisCluster)
        self._scripts = _load_scripts(client)
        # Cluster clients route by slot and single-connection clients share one socket
        # under a lock: both go through redis-py's pipelines instead of a pooled socket.
        self._direct = not self.cluster and getattr(client, "connection", None) is None
        self._heads: dict[str, tuple[int, tuple[str, ...]]] = {}
        """thread id -> (latest step, append-only fields) as this store last saw them: a
        guess that ``latest()`` checks on the server, never trusts."""

    @classmethod
    def from_url(
        cls, url: str, *, cluster: bool = False, max_connections: int | None = None, **options: Any
    ) -> RedisStore:
        """Connect with a ``redis://``, ``rediss://`` or ``unix://`` URL (user, password and
        database as redis-py reads them). ``cluster=True`` uses Redis Cluster. The client's
        pool blocks when ``max_connections`` (per node on Cluster; redis-py's default if
        ``None``) are in use, until one is free or its timeout passes; other keyword
        arguments go to :class:`RedisStore`."""
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise StoreConfigError(
                f"unsupported Redis URL {url!r}; use redis://, rediss:// or unix://"
            )
        parts = urlsplit(url)
        database = parts.path.strip("/") if parts.scheme != "unix" else ""
        # redis-py falls back to database 0 for a path it cannot read: a typo would
        # silently put the checkpoints in another database.
        if database and not database.isdigit():
            raise StoreConfigError(
                f"the Redis URL's database {database!r} is not a number; write e.g. "
                "redis://host:6379/1"
            )
        pool: dict[str, Any] = (
            {} if max_connections is None else {"max_connections": max_connections}
        )
        try:
            client: RedisClient = (
                RedisCluster.from_url(
                    url, connection_pool_class=redis.BlockingConnectionPool, **pool
                )
                if cluster
                else redis.Redis.from_pool(redis.BlockingConnectionPool.from_url(url, **pool))
            )
        except ValueError as exc:  # the message names the part, never the password
            raise StoreConfigError(f"the Redis URL cannot be used: {exc}") from exc
        return cls(client, **options)

    # -- plumbing ------------------------------------------------------------------------

    def _index_keys(self) -> tuple[list[str], list[Any]]:
        """The trailing KEYS and the leading ARGV of every index-maintaining script."""
        if self.cluster:
            return [], [""]
        return [self.keys.due()], [self.keys.status_index_prefix()]

    def _run(self, name: str, keys: list[str], args: list[Any], *, indexed: bool) -> Any:
        if indexed:
            index_keys, index_args = self._index_keys()
            keys, args = keys + index_keys, index_args + args
        reply = self._scripts[name](keys=keys, args=args)
        if indexed:
            self._apply_index_ops(reply)
        return reply

    def _apply_index_ops(self, reply: Any) -> None:
        """On Redis Cluster, apply the index changes a thread script returned."""
        if self.cluster and isinstance(reply, list) and isinstance(reply[-1], list):
            self._scripts["index"](
                keys=[self.keys.due()], args=[self.keys.status_index_prefix(), *reply[-1]]
            )

    def _send(self, commands: Sequence[Sequence[Arg]], *, transaction: bool) -> list[Any]:
        """Run ``commands`` in one round trip, in ``MULTI``/``EXEC`` with ``transaction``;
        return their raw replies, error replies as exceptions in their place.

        On a plain client this writes the commands itself on a pooled connection: a
        redis-py pipeline costs about as much client time as a small ``GET``. Retries on
        connection errors as redis-py does; every caller's commands are safe to resend.
        """
        client = self.client
        if not self._direct or not isinstance(client, redis.Redis):
            pipe = client.pipeline(transaction=transaction)
            for command in commands:
                pipe.execute_command(*command)
            return pipe.execute(raise_on_error=False)
        framed = [("MULTI",), *commands, ("EXEC",)] if transaction else commands
        packed = _resp(framed)
        pool = client.connection_pool
        connection: Any = pool.get_connection()
        try:
            replies: list[Any] = connection.retry.call_with_retry(
                lambda: _exchange(connection, packed, len(framed)),
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

    def _remember(self, thread_id: str, step: int, fields: tuple[str, ...]) -> None:
        heads = self._heads
        if len(heads) >= MAX_REMEMBERED_HEADS and thread_id not in heads:
            heads.clear()
        heads[thread_id] = (step, fields)

    def _meta(self, thread_id: str, fields: dict[str, bytes]) -> ThreadMeta:
        """The meta from its stored fields; remembers the thread's latest step."""
        meta = meta_from_fields(thread_id, fields)
        names = fields.get("log_fields")
        logged = (
            decode_value(names, what="meta.log_fields", thread_id=thread_id, step=None)
            if names
            else ()
        )
        self._remember(thread_id, meta.step, tuple(logged))
        return meta

    def _now(self) -> float:
        seconds, micros = self.client.time()
        return seconds + micros / 1e6

    def _stale(self, thread_id: str, token: int, fence: int, step: int | None = None) -> StaleToken:
        return StaleToken(
            f"fencing token {token} is stale: the thread's current token is {fence}, so "
            "another worker has taken it over; stop driving this thread",
            thread_id=thread_id,
            step=step,
        )

    # -- threads -------------------------------------------------------------------------

    def _do_open_thread(
        self,
        thread_id: str,
        *,
        task: str,
        input: Any,
        start_grace: float,
        options: Mapping[str, Any] | None,
    ) -> tuple[ThreadMeta, bool]:
        blobs = [
            b"" if value is None else encode_value(value, what=name, thread_id=thread_id, step=None)
            for name, value in (("input", input), ("options", options or None))
        ]
        created, flat, _ = self._run(
            "open_thread",
            [self.keys.meta(thread_id)],
            [thread_id, task, blobs[0], start_grace, blobs[1]],
            indexed=True,
        )
        return self._meta(thread_id, _hash_to_fields(flat)), bool(created)

    def _do_meta(self, thread_id: str) -> ThreadMeta | None:
        fields = self.client.hgetall(self.keys.meta(thread_id))
        if not fields:
            return None
        return self._meta(thread_id, _fields(fields))

    def threads(
        self, status: Status | None = None, *, limit: int = 100, offset: int = 0
    ) -> list[ThreadMeta]:
        statuses = [status] if status is not None else list(Status)
        pipe = self.client.pipeline(transaction=False)
        for each in statuses:
            pipe.zrevrange(
                self.keys.status_index(each.value), 0, offset + limit - 1, withscores=True
            )
        ranked = heapq.merge(*pipe.execute(), key=lambda item: -item[1])
        ids = [member.decode() for member, _ in ranked][offset : offset + limit]
        pipe = self.client.pipeline(transaction=False)
        for thread_id in ids:
            pipe.hgetall(self.keys.meta(thread_id))
        metas = []
        for thread_id, fields in zip(ids, pipe.execute(), strict=True):
            if fields:
                metas.append(meta_from_fields(thread_id, _fields(fields)))
        return metas

    def _do_delete_thread(self, thread_id: str) -> bool:
        return self._delete(thread_id, finished_before="")

    def _delete(self, thread_id: str, *, finished_before: float | str) -> bool:
        keys = self.keys
        self._heads.pop(thread_id, None)
        deleted, _ = self._run(
            "delete_thread",
            [
                keys.meta(thread_id),
                keys.latest(thread_id),
                keys.lock(thread_id),
                keys.owned(thread_id),
            ],
            [thread_id, keys.checkpoint_prefix(thread_id), finished_before, keys.thread(thread_id)],
            indexed=True,
        )
        return bool(deleted)

    def _do_fork(self, thread_id: str, step: int, new_thread_id: str) -> ThreadMeta:
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.keys.checkpoint(thread_id, step))
        pipe.hmget(self.keys.meta(thread_id), ["task", "input", "options"])
        data, (task, input_blob, options_blob) = pipe.execute()
        if data is None:
            raise CheckpointNotFound(
                "cannot fork: the checkpoint is not stored (never written, or pruned by "
                "keep_last); list the stored steps with history()",
                thread_id=thread_id,
                step=step,
            )
        source = decode_checkpoint(thread_id, _blob(data), step=step)
        _, lengths = decode_envelope(thread_id, _blob(data), step=step)
        log_args: list[Any] = [len(lengths)]
        for field, length in lengths.items():
            items = self.client.lrange(self.keys.log(thread_id, field), 0, length - 1)
            log_args += [field, len(items), *items]
        created, flat, _ = self._run(
            "create_fork",
            [
                self.keys.meta(new_thread_id),
                self.keys.latest(new_thread_id),
                self.keys.checkpoint(new_thread_id, step),
            ],
            [
                new_thread_id,
                data,
                step,
                source.node or "",
                _text(task or source.task),
                input_blob or "",
                self.keys.thread(new_thread_id),
                _log_fields(lengths),
                options_blob or "",
                *log_args,
            ],
            indexed=True,
        )
        if not created:
            raise ThreadExists(
                f"cannot fork step {step} of {thread_id!r} into an existing thread; pick "
                "another id or delete that thread first",
                thread_id=new_thread_id,
            )
        return self._meta(new_thread_id, _hash_to_fields(flat))

    def _do_reopen(
        self,
        thread_id: str,
        *,
        from_statuses: Collection[Status],
        resume_value: Any,
        start_grace: float,
    ) -> ThreadMeta:
        blob = (
            b""
            if resume_value is UNSET
            else encode_value(resume_value, what="resume value", thread_id=thread_id, step=None)
        )
        code, flat, _ = self._run(
            "reopen",
            [self.keys.meta(thread_id)],
            [thread_id, start_grace, blob, *(s.value for s in from_statuses)],
            indexed=True,
        )
        self._raise_refusal(thread_id, 0, code, flat, None)
        return meta_from_fields(thread_id, _hash_to_fields(flat))

    def _do_request_cancel(self, thread_id: str) -> Status:
        code, status, _ = self._run(
            "request_cancel", [self.keys.meta(thread_id)], [thread_id], indexed=True
        )
        self._raise_refusal(thread_id, 0, code, 0, None)
        return Status(_text(status))

    def _do_put_artifact(self, thread_id: str, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        key = self.keys.artifact(thread_id, digest)
        self._scripts["put_artifact"](keys=[key, self.keys.owned(thread_id)], args=[data])
        return digest

    def _do_get_artifact(self, thread_id: str, digest: str) -> bytes:
        data = self.client.get(self.keys.artifact(thread_id, digest))
        if data is None:
            raise ArtifactNotFound(
                f"artifact {digest} is not stored (deleted with its thread, or from another "
                "thread); keep references only within the thread that stored them",
                thread_id=thread_id,
            )
        return _blob(data)

    def gc(self, finished_ttl: float) -> int:
        cutoff = self._now() - finished_ttl
        removed = 0
        for status in FINISHED:
            for member in self.client.zrangebyscore(
                self.keys.status_index(status.value), "-inf", cutoff
            ):
                removed += self._delete(_text(member), finished_before=cutoff)
        return removed

    # -- lease ---------------------------------------------------------------------------

    def _do_acquire(self, thread_id: str, owner: str, ttl: float) -> int:
        code, value, _ = self._run(
            "acquire",
            [self.keys.lock(thread_id), self.keys.meta(thread_id)],
            [thread_id, owner, _millis(ttl)],
            indexed=True,
        )
        if code == -2:
            raise ThreadNotFound(
                "cannot lease an unknown thread; start it with .delay()/.apply_async() first",
                thread_id=thread_id,
            )
        if code == -1:
            raise LeaseHeld(
                f"another worker drives this thread for {value} ms more; leave it to that "
                "worker (recovery takes over if it dies)",
                thread_id=thread_id,
                ttl_ms=int(value),
            )
        if code == -8:
            raise retry_not_due(thread_id, int(value) / 1000)
        return int(value)

    def _do_renew(self, thread_id: str, owner: str, token: int, ttl: float) -> None:
        ok, _ = self._run(
            "renew",
            [self.keys.lock(thread_id), self.keys.meta(thread_id)],
            [thread_id, f"{token}:{owner}", _millis(ttl)],
            indexed=True,
        )
        if not ok:
            raise LeaseLost(
                f"lease with token {token} expired or passed to another worker; stop "
                "driving this thread (raise lease_ttl if its steps block for long)",
                thread_id=thread_id,
            )

    def _do_release(self, thread_id: str, owner: str, token: int) -> bool:
        return bool(
            self._scripts["release"](keys=[self.keys.lock(thread_id)], args=[f"{token}:{owner}"])
        )

    # -- checkpoints ---------------------------------------------------------------------

    def _do_commit(
        self,
        thread_id: str,
        token: int,
        checkpoint: Checkpoint,
        *,
        status: Status,
        due_in: float | _Unset | None,
        result: Any,
        interrupt: Any,
        release_owner: str | None,
        logs: Mapping[str, int] | None,
    ) -> bool:
        step = checkpoint.step
        encoded = encode_checkpoint(
            thread_id, checkpoint, limit=self.max_checkpoint_bytes, logs=logs
        )
        blobs = [
            b""
            if value is UNSET
            else encode_value(value, what=name, thread_id=thread_id, step=step)
            for name, value in (("result", result), ("interrupt", interrupt))
        ]
        log_args: list[Arg] = [len(encoded.appended)]
        for field, items in encoded.appended.items():
            log_args += [field, (logs or {})[field], len(items), *items]
        base = self.keys.thread(thread_id)
        staged = self.keys.staged(thread_id)
        reply = self._commit_staged(
            staged,
            encoded.snapshot,
            [f"{base}meta", f"{base}latest", f"{base}checkpoint:{step}", f"{base}lock", staged],
            [
                token,
                step,
                status.value,
                _due_arg(due_in),
                f"{token}:{release_owner}" if release_owner else "",
                self.keep_last,
                checkpoint.node or "",
                *blobs,
                _log_fields(logs or {}),
                *log_args,
            ],
        )
        self._apply_index_ops(reply)
        code, value, _ = reply
        self._raise_refusal(thread_id, token, code, value, step)
        self._remember(thread_id, step, tuple(logs or ()))
        return bool(value)

    def _commit_staged(
        self, staged: str, snapshot: bytes, keys: list[str], args: list[Arg]
    ) -> list[Any]:
        """``MULTI``, ``SET`` the snapshot to the staged key, run commit.lua (which moves it
        into place or deletes it), ``EXEC``: one round trip, and the snapshot's bytes
        never pass through Lua. A server that lost the script gets it loaded, then the
        whole transaction again (the staged key is simply overwritten)."""
        script = self._scripts["commit"]
        index_keys, index_args = self._index_keys()
        stage = ("SET", staged, snapshot)
        run = (
            "EVALSHA",
            script.sha,
            len(keys) + len(index_keys),
            *keys,
            *index_keys,
            *index_args,
            *args,
        )
        for attempt in range(2):
            stored, reply = self._send([stage, run], transaction=True)
            if isinstance(stored, Exception):
                raise stored
            if isinstance(reply, NoScriptError) and attempt == 0:
                self.client.script_load(script.script)
                continue
            if isinstance(reply, Exception):
                raise reply
            return list(reply)
        raise AssertionError("unreachable")

    def _raise_refusal(
        self, thread_id: str, token: int, code: int, value: int, step: int | None
    ) -> None:
        if code == -1:
            raise self._stale(thread_id, token, value, step)
        if code == -2:
            raise StepConflict(
                f"cannot commit step {step}: the latest stored step is {value}, not "
                f"{(step or 0) - 1}; another driver wrote it, reload with latest()",
                thread_id=thread_id,
                step=step or 0,
                latest=value,
            )
        if code == -3:
            raise ThreadNotFound(
                "the store holds no such thread; create it with open_thread()",
                thread_id=thread_id,
                step=step,
            )
        if code == -7:
            raise LogConflict(
                f"the stored log of state.{_text(value)} does not end where this checkpoint "
                "continues it; reload the thread with latest() and continue from there",
                thread_id=thread_id,
                step=step,
            )
        if code == -6:
            raise ThreadStateError(
                f"the thread is {_text(value)}, which does not allow this; see its status "
                "with meta()",
                thread_id=thread_id,
                status=_text(value),
            )

    def _do_set_status(
        self,
        thread_id: str,
        token: int,
        status: Status,
        *,
        due_in: float | None,
        error: str | _Unset | None,
        attempts: int | _Unset,
        crashes: int | _Unset,
        result: Any,
        interrupt: Any,
        release_owner: str | None,
    ) -> None:
        fields: dict[str, Any] = {}
        if not isinstance(error, _Unset):
            fields["error"] = error or ""
        if not isinstance(attempts, _Unset):
            fields["attempts"] = attempts
        if not isinstance(crashes, _Unset):
            fields["crashes"] = crashes
        for name, value in (("result", result), ("interrupt", interrupt)):
            if value is not UNSET:
                fields[name] = (
                    b""
                    if value is None
                    else encode_value(value, what=name, thread_id=thread_id, step=None)
                )
        code, value, _ = self._run(
            "set_status",
            [self.keys.meta(thread_id), self.keys.lock(thread_id)],
            [
                thread_id,
                token,
                status.value,
                "" if due_in is None else due_in,
                f"{token}:{release_owner}" if release_owner else "",
                *_pairs(fields),
            ],
            indexed=True,
        )
        self._raise_refusal(thread_id, token, code, value, None)

    def _do_latest(self, thread_id: str) -> Checkpoint | None:
        head = self._heads.get(thread_id)
        if head is not None:
            guessed, found = self._latest_at(thread_id, *head)
            if guessed:
                return found
        return self._latest_script(thread_id)

    def _latest_at(
        self, thread_id: str, step: int, fields: tuple[str, ...]
    ) -> tuple[bool, Checkpoint | None]:
        """``(True, latest checkpoint or None)`` if the latest step is ``step`` (or there is
        none) and its logs are among ``fields``, read with one ``MGET`` (and an ``LRANGE``
        per log, in a ``MULTI``): its bytes never pass through Lua. ``(False, None)`` when
        the guess was wrong."""
        base = self.keys.thread(thread_id)
        read = ("MGET", f"{base}latest", f"{base}checkpoint:{step}")
        if fields:
            replies = self._send(
                [read, *(("LRANGE", f"{base}log:{field}", 0, -1) for field in fields)],
                transaction=True,
            )
        else:
            replies = self._send([read], transaction=False)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        (latest, data), *items = replies
        if latest is None:
            return True, None
        if int(latest) != step or data is None:
            return False, None
        envelope, lengths = decode_envelope(thread_id, _blob(data), step=step)
        if not lengths.keys() <= set(fields):
            return False, None
        log_items = dict(zip(fields, items, strict=True))
        return True, build_checkpoint(thread_id, envelope, log_items, step=step)

    def _latest_script(self, thread_id: str) -> Checkpoint | None:
        """The latest checkpoint through latest.lua: one round trip, whatever the step."""
        reply = self._scripts["latest"](
            keys=[self.keys.latest(thread_id)],
            args=[self.keys.checkpoint_prefix(thread_id), self.keys.thread(thread_id)],
        )
        if reply is None:
            self._remember(thread_id, -1, ())
            return None
        step, data = int(reply[0]), reply[1]
        if data is None:
            raise CheckpointNotFound(
                "the latest pointer names a checkpoint that is missing; fork the thread "
                "from an earlier step",
                thread_id=thread_id,
                step=step,
            )
        envelope, _ = decode_envelope(thread_id, data, step=step)
        log_items = {_text(reply[i]): reply[i + 1] for i in range(2, len(reply), 2)}
        self._remember(thread_id, step, tuple(log_items))
        return build_checkpoint(thread_id, envelope, log_items, step=step)

    def _with_logs(self, thread_id: str, blobs: list[tuple[int, bytes]]) -> list[Checkpoint]:
        """Checkpoints from their snapshots, reading their logs in one more round trip."""
        decoded = [(step, *decode_envelope(thread_id, data, step=step)) for step, data in blobs]
        pipe = self.client.pipeline(transaction=False)
        for _, _, lengths in decoded:
            for field, length in lengths.items():
                pipe.lrange(self.keys.log(thread_id, field), 0, length - 1)
        fetched = iter(pipe.execute() if any(lengths for *_, lengths in decoded) else [])
        return [
            build_checkpoint(thread_id, envelope, {f: next(fetched) for f in lengths}, step=step)
            for step, envelope, lengths in decoded
        ]

    def _do_checkpoint(self, thread_id: str, step: int) -> Checkpoint:
        data = self.client.get(self.keys.checkpoint(thread_id, step))
        if data is None:
            raise CheckpointNotFound(
                "no such checkpoint (never written, or pruned by keep_last); list the "
                "stored steps with history()",
                thread_id=thread_id,
                step=step,
            )
        return self._with_logs(thread_id, [(step, _blob(data))])[0]

    def _do_history(self, thread_id: str, *, before: int | None, limit: int) -> list[Checkpoint]:
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.keys.latest(thread_id))
        pipe.hget(self.keys.meta(thread_id), "first")
        latest, first = pipe.execute()
        if latest is None:
            return []
        top = int(latest) if before is None else min(int(latest), before - 1)
        steps = list(range(top, max(int(first or 0), top - limit + 1) - 1, -1))
        if not steps:
            return []
        blobs = self.client.mget([self.keys.checkpoint(thread_id, s) for s in steps])
        return self._with_logs(
            thread_id,
            [(s, _blob(data)) for s, data in zip(steps, blobs, strict=True) if data is not None],
        )

    # -- effects -------------------------------------------------------------------------

    def _effect_keys(self, thread_id: str, key: str, *, shared: bool) -> list[str]:
        if not shared:
            return [
                self.keys.effect(thread_id, key),
                self.keys.meta(thread_id),
                self.keys.owned(thread_id),
            ]
        if self.cluster:
            return [self.keys.global_effect(key)]
        return [self.keys.global_effect(key), self.keys.meta(thread_id)]

    def _check_fence_apart(self, thread_id: str, token: int, shared: bool) -> None:
        """On Redis Cluster a shared record lives in another slot than the thread's meta,
        so its claim cannot check the token in the same script: check it just before."""
        if shared and self.cluster:
            fence = self.client.hget(self.keys.meta(thread_id), "fence")
            self._raise_refusal(
                thread_id,
                token,
                -3 if fence is None else (-1 if int(fence) != token else 1),
                int(fence or 0),
                None,
            )

    def _do_claim_effect(
        self,
        thread_id: str,
        key: str,
        token: int,
        *,
        shared: bool,
        takeover: bool,
        claim_id: str,
    ) -> Claim:
        keys = self._effect_keys(thread_id, key, shared=shared)
        self._check_fence_apart(thread_id, token, shared)
        code, holder, result = self._scripts["claim_effect"](
            keys=keys, args=[token, "1" if takeover else "0", claim_id]
        )
        self._raise_refusal(thread_id, token, code, holder, None)
        if code == 2:
            value = decode_value(
                result, what=f"effect {key!r} result", thread_id=thread_id, step=None
            )
            return Claim("done", Effect(key, "done", int(holder), value))
        outcome = "claimed" if code == 1 else "unknown"
        return Claim(outcome, Effect(key, "pending", int(holder)))

    def _do_complete_effect(
        self, thread_id: str, key: str, token: int, result: Any, *, shared: bool
    ) -> None:
        keys = self._effect_keys(thread_id, key, shared=shared)[:2]
        blob = encode_value(result, what=f"effect {key!r} result", thread_id=thread_id, step=None)
        self._check_fence_apart(thread_id, token, shared)
        code, holder, _ = self._scripts["complete_effect"](keys=keys, args=[token, blob])
        self._raise_refusal(thread_id, token, code, holder, None)
        if code == -4:
            raise EffectError(
                f"effect {key!r} was never claimed; call claim_effect() before completing it",
                thread_id=thread_id,
            )
        if code == -5:
            raise self._not_holder(thread_id, key, token, holder)

    def _do_release_effect(
        self, thread_id: str, key: str, token: int, *, claim_id: str, shared: bool
    ) -> None:
        keys = self._effect_keys(thread_id, key, shared=shared)
        self._check_fence_apart(thread_id, token, shared)
        code, holder, _ = self._scripts["release_effect"](keys=keys, args=[token, claim_id])
        self._raise_refusal(thread_id, token, code, holder, None)
        if code == -5:
            raise self._not_holder(thread_id, key, token, holder)

    @staticmethod
    def _not_holder(thread_id: str, key: str, token: int, holder: int) -> StaleToken:
        return StaleToken(
            f"effect {key!r} is not pending under token {token} (holder: {holder}); "
            "another driver owns it now",
            thread_id=thread_id,
        )

    def _do_effect(self, thread_id: str, key: str, *, shared: bool) -> Effect | None:
        record = _fields(self.client.hgetall(self._effect_keys(thread_id, key, shared=shared)[0]))
        if not record:
            return None
        result = record.get("result")
        return Effect(
            key,
            record["state"].decode(),
            int(record["token"]),
            None
            if result is None
            else decode_value(
                result, what=f"effect {key!r} result", thread_id=thread_id, step=None
            ),
        )

    # -- recovery ------------------------------------------------------------------------

    def due(self, *, limit: int = 100) -> list[tuple[str, float]]:
        entries: list[tuple[bytes, float]] = self.client.zrangebyscore(  # type: ignore[assignment]
            self.keys.due(), "-inf", self._now(), start=0, num=limit, withscores=True
        )
        return [(_text(member), float(score)) for member, score in entries]

    def claim_due(self, *, hold: float, limit: int = 100) -> list[str]:
        ids = self._scripts["claim_due"](keys=[self.keys.due()], args=[hold, limit])
        return [member.decode() for member in ids]

    def _do_lease_sweeper(self, owner: str, ttl: float) -> bool:
        return bool(
            self._scripts["lease_sweeper"](keys=[self.keys.sweeper()], args=[owner, _millis(ttl)])
        )

    # -- operations ----------------------------------------------------------------------

    def check(self) -> list[Finding]:
        try:
            config = {
                _text(name): _text(value) for name, value in self.client.config_get("*").items()
            }
        except redis.ResponseError as exc:
            return [
                Finding(
                    "CONFIG",
                    "unavailable",
                    f"cannot read the server's settings ({exc}).",
                    "check persistence and eviction with your provider",
                )
            ]
        return redis_findings(config)

    def close(self) -> None:
        self.client.close()

    def graph(self) -> RedisGraph:
        return RedisGraph(self.client, self.keys)


def redis_findings(config: dict[str, str]) -> list[Finding]:
    """Judge a Redis ``CONFIG GET *`` answer for checkpoint durability."""
    findings = []
    aof = config.get("appendonly") == "yes"
    if not aof and not config.get("save"):
        findings.append(
            Finding(
                "appendonly",
                "no",
                "no persistence (AOF off and no RDB snapshots): a restart of the server loses "
                "every checkpoint.",
                "start Redis with --appendonly yes --appendfsync always",
            )
        )
    elif not aof:
        findings.append(
            Finding(
                "appendonly",
                "no",
                "only RDB snapshots: a crash loses every checkpoint written since the last one.",
                "start Redis with --appendonly yes --appendfsync always",
            )
        )
    elif config.get("appendfsync") not in ("always", "everysec"):
        findings.append(
            Finding(
                "appendfsync",
                config.get("appendfsync", "?"),
                "the OS decides when the AOF reaches disk: a power loss can drop acknowledged "
                "checkpoints.",
                "set appendfsync always (or everysec to risk at most one second)",
            )
        )
    policy = config.get("maxmemory-policy", "noeviction")
    if policy != "noeviction":
        findings.append(
            Finding(
                "maxmemory-policy",
                policy,
                "Redis may evict checkpoints, leases and effect records under memory pressure.",
                "set maxmemory-policy noeviction (writes then fail loudly instead)",
            )
        )
    return findings
