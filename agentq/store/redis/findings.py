"""What ``check()`` reports about a Redis server's settings: persistence and eviction, the
two that decide whether an acknowledged checkpoint survives, and whether it is a replica,
which takes none."""

from __future__ import annotations

from typing import Final

import redis
from redis.cluster import RedisCluster

from agentq.errors import StoreConfigError
from agentq.records import Finding
from agentq.store.redis.decode import text
from agentq.store.redis.transient import untrusted_certificate

_REPLICA_PROBLEM: Final = (
    "the store is a replica: it refuses every write, which agentq would wait out as an "
    "outage (or, with replica-read-only no, its primary's next sync drops them)."
)
_REPLICA_FIX: Final = (
    "point the store URL at the primary (with Sentinel, pass "
    "RedisStore(Sentinel(hosts).master_for(name)))"
)


def server_findings(client: redis.Redis | RedisCluster) -> list[Finding]:
    """Read the server's settings and judge them; a managed server may refuse ``CONFIG``.

    Raises :class:`~agentq.errors.StoreConfigError` when the server refuses the
    connection's own setup (the URL's credentials, database or TLS trust), which is no
    finding about settings."""
    try:
        client.ping()
    except redis.AuthenticationError as exc:
        raise StoreConfigError(
            f"the Redis server refused the store URL's credentials ({exc}); put the user "
            "and password it expects in the URL, redis://user:password@host:6379/1 (or "
            "redis://:password@host:6379/1 for a server with requirepass alone)"
        ) from exc
    except redis.ConnectionError as exc:
        if not untrusted_certificate(exc):
            raise
        raise StoreConfigError(
            f"the Redis server's TLS certificate is not trusted ({exc}); name the CA that "
            "signed it in the URL, rediss://host:6380/1?ssl_ca_certs=/path/ca.pem (and "
            "connect by the host name the certificate holds)"
        ) from exc
    except redis.ResponseError as exc:
        raise StoreConfigError(
            f"the Redis server refused the connection's setup ({exc}); check the URL's "
            "database number: a server has 0 to 15 unless its databases setting says more, "
            "and Redis Cluster only 0 (e.g. redis://host:6379/1)"
        ) from exc
    try:
        config = {text(name): text(value) for name, value in client.config_get("*").items()}
    except redis.ResponseError as exc:
        unavailable = Finding(
            "CONFIG",
            "unavailable",
            f"cannot read the server's settings ({exc}).",
            "check persistence and eviction with your provider",
        )
        # Told apart without CONFIG, as a managed server hides it: a replica is no risk to
        # some checkpoints but refuses them all.
        return [unavailable, *_replica_findings(client)]
    return redis_findings(config)


def _replica_findings(client: redis.Redis | RedisCluster) -> list[Finding]:
    """A fatal finding if the server says, in ``HELLO`` (which every user may run), that
    it is a replica. Redis Cluster's client only sends commands to primaries."""
    if isinstance(client, RedisCluster):
        return []
    try:
        reply = client.execute_command("HELLO")  # type: ignore[no-untyped-call]
    except redis.ResponseError:
        return []
    fields = reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2], strict=True))
    role = text(fields.get(b"role", fields.get("role", "")))
    if role != "replica":
        return []
    return [Finding("role", role, _REPLICA_PROBLEM, _REPLICA_FIX, fatal=True)]


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
                fatal=True,
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
    primary = config.get("replicaof", "")
    if primary:
        findings.append(
            Finding(
                "replicaof",
                primary,
                _REPLICA_PROBLEM,
                _REPLICA_FIX,
                fatal=True,
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
                fatal=True,
            )
        )
    return findings
