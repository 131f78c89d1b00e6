"""What every part of :class:`~agentq.store.redis.store.RedisStore` stands on: the client,
the keys, the scripts, the global indexes, and the latest steps it has seen.

Every write is one Lua script on the thread's keys (see :mod:`agentq.ids`), so it is
atomic and costs one round trip. On a single server the global indexes change in the
same script; on Redis Cluster they live in another slot and follow in a second call
(see ``lua/_prelude.lua`` for how they catch up when that call is lost).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Self
from urllib.parse import urlsplit

import redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError
from redis.typing import EncodableT

from agentq.codec.envelope import decode_value
from agentq.errors import StoreConfigError
from agentq.records import ThreadMeta
from agentq.settings import DEFAULT_KEEP_LAST, DEFAULT_MAX_CHECKPOINT_BYTES
from agentq.store.contract import Store
from agentq.store.meta_fields import meta_from_fields
from agentq.store.redis.keys import Keys
from agentq.store.redis.scripts import STORE_SCRIPTS, RedisClient, load_scripts
from agentq.store.redis.transient import TRANSIENT_ERRORS, is_transient
from agentq.store.redis.wire import send

MAX_REMEMBERED_HEADS = 10_000
"""How many threads' latest steps a store remembers to read ``latest()`` with one ``MGET``."""

SOCKET_TIMEOUT = 5.0
"""Seconds :meth:`RedisBase.from_url`'s clients wait for a reply (and a connection):
redis-py's own default since 8.0, set here for the earlier versions, which wait without
limit. Every script agentq runs takes milliseconds, so a wait this long means a frozen
server or a lost network path, which TCP alone takes minutes to report: meanwhile a
worker's leases could be neither renewed nor given up."""


def request_id() -> str:
    """Names one operator request (a reopen, a settled effect, a fork) for its script,
    which keeps the id of the last one it applied: redis-py resends a call whose reply was
    lost, and the resend must answer as the first run did, not be refused by what it left."""
    return uuid.uuid4().hex


class RedisBase(Store):
    """The client, keys and scripts of a Redis store, and the plumbing its operations share.

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
        self._scripts = load_scripts(client, STORE_SCRIPTS, ("_prelude",))
        self._heads: dict[str, tuple[int, tuple[str, ...]]] = {}
        """thread id -> (latest step, append-only fields) as this store last saw them: a
        guess that ``latest()`` checks on the server, never trusts."""
        self._synced_cursor = 0
        """Where the next limited ``gc`` goes on through the synced hash (Redis Cluster)."""

    @classmethod
    def from_url(
        cls, url: str, *, cluster: bool = False, max_connections: int | None = None, **options: Any
    ) -> Self:
        """Connect with a ``redis://``, ``rediss://`` or ``unix://`` URL (user, password and
        database as redis-py reads them). ``cluster=True`` uses Redis Cluster. The client's
        pool blocks when ``max_connections`` (per node on Cluster; redis-py's default if
        ``None``) are in use, until one is free or its timeout passes. A reply not read
        within :data:`SOCKET_TIMEOUT` (or the URL's ``?socket_timeout=``) raises
        ``redis.TimeoutError``, which agentq retries. Other keyword arguments go to the
        store."""
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
        # A URL's own socket_timeout wins: redis-py lets its query override these.
        pool: dict[str, Any] = {"socket_timeout": SOCKET_TIMEOUT}
        if max_connections is not None:
            pool["max_connections"] = max_connections
        try:
            client: RedisClient
            if cluster:
                client = RedisCluster.from_url(
                    url, connection_pool_class=redis.BlockingConnectionPool, **pool
                )
            else:
                blocking = redis.BlockingConnectionPool.from_url(url, **pool)
                # redis-py hands a query option it does not know to the connection, which
                # refuses it only when the first command connects: in a worker's first
                # step, or a caller's .delay(), rather than here.
                blocking.connection_class(**blocking.connection_kwargs)
                client = redis.Redis.from_pool(blocking)
        except ValueError as exc:  # the message names the part, never the password
            raise StoreConfigError(f"the Redis URL cannot be used: {exc}") from exc
        except TypeError as exc:
            raise StoreConfigError(
                f"the Redis URL's query has an option redis-py does not take ({exc}); "
                "check its spelling against redis-py's connection arguments (ssl_* ones "
                "need rediss://), e.g. ?socket_timeout=5&health_check_interval=30"
            ) from exc
        return cls(client, **options)

    # -- the global indexes --------------------------------------------------------------

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

    def _run_many(self, name: str, calls: Sequence[tuple[list[str], list[Any]]]) -> list[Any]:
        """:meth:`_send_many`, raising the first error reply."""
        replies = self._send_many(name, calls)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    def _send_many(self, name: str, calls: Sequence[tuple[list[str], list[Any]]]) -> list[Any]:
        """Script ``name`` once per ``(keys, args)`` in one round trip (one per node on
        Cluster); the replies in order, an error reply as the exception in its place.
        Each call must be safe to send twice: a server that lost the script gets it
        loaded and the whole batch again."""
        if not calls:
            return []
        script = self._scripts[name]
        commands = [("EVALSHA", script.sha, len(keys), *keys, *args) for keys, args in calls]
        replies = self._send(commands, transaction=False)
        if any(isinstance(reply, NoScriptError) for reply in replies):
            self.client.script_load(script.script)
            replies = self._send(commands, transaction=False)
        return replies

    def _apply_index_ops(self, reply: Any) -> None:
        """On Redis Cluster, put in place the index entries a thread script returned."""
        if self.cluster and isinstance(reply, list) and isinstance(reply[-1], list):
            self._scripts["index"](keys=self._sync_keys(), args=self._sync_args(reply[-1]))

    def _sync_keys(self) -> list[str]:
        return [self.keys.due(), self.keys.synced()]

    def _sync_args(self, ops: list[Any]) -> list[Any]:
        return [self.keys.status_index_prefix(), *ops]

    def sync_index(self, thread_id: str) -> None:
        super().sync_index(thread_id)
        if self.cluster:
            self._run("sync_index", [self.keys.meta(thread_id)], [thread_id], indexed=True)

    def _send(self, commands: Sequence[Sequence[EncodableT]], *, transaction: bool) -> list[Any]:
        return send(self.client, commands, transaction=transaction)

    # -- what the store has seen ---------------------------------------------------------

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
