"""agentq's settings: given to ``init_app`` or set as ``app.conf.agentq_<name>``."""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any, Final

from agentq.errors import SettingsError
from agentq.limits import Limit, Limits

CONF_PREFIX = "agentq_"
DEFAULT_KEEP_LAST: Final = 20
DEFAULT_MAX_CHECKPOINT_BYTES: Final = 1024 * 1024


CONNECTIONS_FOR_STEPS_CAP: Final = 50
"""Past this many, more connections only queue commands in Redis (it runs one at a time)
instead of in the pool: a task holds a connection only for a store call, not while its
model call waits."""


def connections_for(tasks_at_once: int) -> int:
    """The default ``max_connections`` of a process running ``tasks_at_once`` tasks: one
    per task up to :data:`CONNECTIONS_FOR_STEPS_CAP`, plus the lease keeper and the
    recovery sweeper."""
    return min(tasks_at_once, CONNECTIONS_FOR_STEPS_CAP) + 2


@dataclass(frozen=True)
class Settings:
    """Every duration is in seconds.

    ``store`` is a URL (``redis://…``, ``rediss://…``, ``unix://…``, ``sqlite:///…``), a
    :class:`~agentq.store.contract.Store`, or a redis-py client (``redis.Redis``,
    ``RedisCluster``) used as it is, its own pool bound in place of ``max_connections``.
    A worker that dies is noticed when its lease runs out, so ``lease_ttl`` bounds recovery
    time; it is renewed every ``lease_ttl / 3`` while a step runs, however long that step
    blocks.

    ``max_connections`` bounds each process's connections to a Redis store (per
    node on Cluster); a task that finds them all busy waits for one instead of failing.
    ``None`` sizes it from the tasks the process runs at once (see :func:`connections_for`);
    a process that is not a worker, sending from as many threads as it has, gets a full
    worker's.

    ``limits`` are the fleet-wide budgets tool calls take from (see :func:`agentq.limit`);
    a call that would wait up to ``limit_wait`` for one waits in place, a longer wait ends
    the step as ``retrying`` until the budget allows it. A limit's ``threads`` caps the
    threads of a concurrency key (``AgentTask.concurrency_key``) running at once.

    ``allow_unsafe_store`` lets workers and the command line use a store whose ``check()``
    finds it would lose checkpoints (an evicting policy, no persistence): for development
    only; they log what they found instead of refusing it.

    ``metrics_port``: each worker serves Prometheus metrics on this port (needs the
    ``prometheus`` extra); ``None`` serves none.
    """

    store: str | object = "sqlite:///agentq.db"
    prefix: str = "agentq:"
    lease_ttl: float = 30.0
    start_grace: float = 30.0
    sweep_interval: float = 1.0
    max_attempts: int = 5
    backoff_base: float = 1.0
    backoff_max: float = 300.0
    max_crashes: int = 3
    keep_last: int = DEFAULT_KEEP_LAST
    max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES
    max_artifact_bytes: int = 64 * 1024 * 1024
    finished_ttl: float = 7 * 24 * 3600.0
    max_connections: int | None = None
    allow_unsafe_store: bool = False
    limits: tuple[Limit, ...] = ()
    limit_wait: float = 1.0
    metrics_port: int | None = None

    def __post_init__(self) -> None:
        for name in ("lease_ttl", "start_grace", "sweep_interval", "backoff_max"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"agentq setting {name} must be positive")
        if self.max_connections is not None and self.max_connections < 2:
            raise SettingsError(
                f"agentq setting max_connections ({self.max_connections}) must be at least 2: "
                "one for the lease keeper, one for the steps"
            )
        if not self.finished_ttl >= 0:  # NaN too: no age compares with it
            raise SettingsError(
                f"agentq setting finished_ttl ({self.finished_ttl}) must be seconds, 0 or "
                "more (inf keeps finished threads for good)"
            )
        if self.limit_wait < 0:
            raise SettingsError("agentq setting limit_wait must not be negative")
        object.__setattr__(self, "limits", tuple(self.limits))
        self.declared_limits  # noqa: B018  # built now: bad declarations fail at setup
        if self.max_attempts < 1 or self.max_crashes < 1:
            raise SettingsError("agentq settings max_attempts and max_crashes must be >= 1")
        if self.backoff_base > self.backoff_max:
            raise SettingsError(
                f"agentq setting backoff_base ({self.backoff_base}) exceeds backoff_max "
                f"({self.backoff_max})"
            )

    @cached_property
    def declared_limits(self) -> Limits:
        """:attr:`limits` looked up by the key a call or a thread names, built once."""
        return Limits(self.limits)

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_conf(cls, conf: Any, overrides: dict[str, Any]) -> Settings:
        """Read ``agentq_*`` keys from a Celery config, then apply ``overrides``."""
        unknown = set(overrides) - set(cls.names())
        if unknown:
            raise SettingsError(
                f"unknown agentq setting(s): {', '.join(sorted(unknown))}; known: "
                f"{', '.join(cls.names())}"
            )
        values = {
            name: conf.get(CONF_PREFIX + name)
            for name in cls.names()
            if conf.get(CONF_PREFIX + name) is not None
        }
        values.update(overrides)
        return cls(**values)
