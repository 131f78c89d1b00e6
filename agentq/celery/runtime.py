"""Wiring agentq into a Celery app: settings, the store, the worker's bootstep."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from agentq.errors import SettingsError
from agentq.settings import CONNECTIONS_FOR_STEPS_CAP, Settings, connections_for
from agentq.store import open_store
from agentq.store.contract import Store

if TYPE_CHECKING:
    import redis
    from redis.cluster import RedisCluster

WORKER_STEP: Final = "agentq.celery.bootstep:AgentqWorkerStep"
"""The bootstep that runs recovery and the deploy hand-over, named as Celery loads steps."""


class Runtime:
    """agentq's state for one Celery app: its settings and its store, opened on first use
    (so a prefork child opens its own connections)."""

    def __init__(self, settings: Settings, reread: Callable[[], Settings] | None = None) -> None:
        self._settings = settings
        self._reread = reread
        """Reads the settings again at their first use, once the app's module has run."""
        self._rereading = threading.Lock()
        # Checked here, taken at first use: a redis-py client becomes a store under the
        # prefix and bounds the settings have by then, once the app's module has run.
        _check_store(settings)
        self._store: Store | None = None
        self._opening = threading.Lock()
        self._pid = os.getpid()
        self.tasks_at_once: int | None = None
        """How many tasks this process runs at once; the worker's bootstep sets it.
        ``None`` outside a worker: a process that only sends (a web server) may call
        ``delay()`` from as many threads as it serves requests with."""

    @property
    def settings(self) -> Settings:
        if self._reread is not None:
            # Under a threads pool the first tasks get here at once: one reads.
            with self._rereading:
                reread, self._reread = self._reread, None
                if reread is not None:
                    self._settings = reread()
        return self._settings

    @settings.setter
    def settings(self, settings: Settings) -> None:
        self._settings, self._reread = settings, None

    @property
    def store(self) -> Store:
        if self._store is None:
            # A threads pool starts its tasks at once: without the lock each would open a
            # store of its own, and a SQLite store's threads would no longer share one
            # connection but wait on each other's file locks.
            if self._pid != os.getpid():
                # A parent thread may have held the lock at fork(); it does not exist here.
                self._opening, self._pid = threading.Lock(), os.getpid()
            with self._opening:
                if self._store is None:
                    self._store = _given_store(self.settings) or self._open()
        return self._store

    def _open(self) -> Store:
        s = self.settings
        assert isinstance(s.store, str)
        return open_store(
            s.store,
            prefix=s.prefix,
            keep_last=s.keep_last,
            max_checkpoint_bytes=s.max_checkpoint_bytes,
            max_connections=s.max_connections or connections_for(self._callers_at_once()),
        )

    def _callers_at_once(self) -> int:
        """A process that only sends gets a full worker's pool: sized as one task's, three
        connections made 16 threads calling ``delay()`` at once wait for one another's
        store writes. The pool opens a connection only when every open one is busy, so a
        single-threaded caller still holds one."""
        return CONNECTIONS_FOR_STEPS_CAP if self.tasks_at_once is None else self.tasks_at_once


def _given_store(settings: Settings) -> Store | None:
    """The store the settings hold as an object (a redis-py client becomes a
    :class:`~agentq.store.redis.store.RedisStore` on it, its own pool and timeouts kept);
    ``None`` for a URL, opened on first use."""
    given = _check_store(settings)
    if isinstance(given, str | Store):
        return given if isinstance(given, Store) else None
    from agentq.store.redis.store import RedisStore

    return RedisStore(
        given,
        prefix=settings.prefix,
        keep_last=settings.keep_last,
        max_checkpoint_bytes=settings.max_checkpoint_bytes,
    )


def _check_store(settings: Settings) -> str | Store | redis.Redis | RedisCluster:
    """The store setting, refused unless it is a URL, a store or a redis-py client."""
    given = settings.store
    if isinstance(given, str | Store):
        return given
    # Here, not at the top: a SQLite store's processes need not import redis-py.
    import redis
    from redis.cluster import RedisCluster

    if isinstance(given, redis.Redis | RedisCluster):
        return given
    raise SettingsError(
        f"agentq setting store is a {type(given).__name__}; give a URL "
        "(redis://host:6379/1, sqlite:///agentq.db), a redis-py client (redis.Redis or "
        "RedisCluster; for a connection pool, redis.Redis(connection_pool=pool)) or a store "
        "(RedisStore, SQLiteStore)"
    )


def init_app(
    app: Any, store: str | Store | redis.Redis | RedisCluster | None = None, **settings: Any
) -> Runtime:
    """Configure agentq for ``app``: ``store`` is a URL, a redis-py client or a store
    object, ``settings``
    any field of :class:`~agentq.settings.Settings`; ``app.conf.agentq_<name>`` values are
    read first and the arguments override them. Adds the recovery sweeper and the deploy
    handoff to the app's workers."""
    overrides = dict(settings)
    if store is not None:
        overrides["store"] = store
    # Read now, so that a bad value fails here; and again at first use, so that settings
    # made after this call count (app.conf.agentq_store = ..., or a config_from_object()
    # below it as Celery modules and Django's often have), rather than the store silently
    # being the default SQLite file.
    app._agentq_runtime = runtime = Runtime(
        Settings.from_conf(app.conf, overrides),
        reread=lambda: Settings.from_conf(app.conf, overrides),
    )
    app.steps["worker"].add(WORKER_STEP)
    return runtime


_configuring = threading.Lock()
"""Held while an app that never called ``init_app`` gets its runtime: the first threads of
a producer using it at once would each make one, and open a store of their own."""


def runtime_of(app: Any) -> Runtime:
    """The app's runtime; configured from ``app.conf`` alone if ``init_app`` was not called."""
    runtime = getattr(app, "_agentq_runtime", None)
    if isinstance(runtime, Runtime):
        return runtime
    with _configuring:
        runtime = getattr(app, "_agentq_runtime", None)
        return runtime if isinstance(runtime, Runtime) else init_app(app)
