"""Wiring agentq into a Celery app: settings, the store, the worker's bootstep."""

from __future__ import annotations

from typing import Any, Final

from agentq.settings import Settings, connections_for
from agentq.store import open_store
from agentq.store.contract import Store

WORKER_STEP: Final = "agentq.celery.bootstep:AgentqWorkerStep"
"""The bootstep that runs recovery and the deploy hand-over, named as Celery loads steps."""


class Runtime:
    """agentq's state for one Celery app: its settings and its store, opened on first use
    (so a prefork child opens its own connections)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._store = settings.store if isinstance(settings.store, Store) else None
        self.tasks_at_once = 1
        """How many tasks this process runs at once; the worker's bootstep sets it."""

    @property
    def store(self) -> Store:
        if self._store is None:
            s = self.settings
            assert isinstance(s.store, str)
            self._store = open_store(
                s.store,
                prefix=s.prefix,
                keep_last=s.keep_last,
                max_checkpoint_bytes=s.max_checkpoint_bytes,
                max_connections=s.max_connections or connections_for(self.tasks_at_once),
            )
        return self._store


def init_app(app: Any, store: str | Store | None = None, **settings: Any) -> Runtime:
    """Configure agentq for ``app``: ``store`` is a URL or a store object, ``settings``
    any field of :class:`~agentq.settings.Settings`; ``app.conf.agentq_<name>`` values are
    read first and the arguments override them. Adds the recovery sweeper and the deploy
    handoff to the app's workers."""
    overrides = dict(settings)
    if store is not None:
        overrides["store"] = store
    runtime = Runtime(Settings.from_conf(app.conf, overrides))
    app._agentq_runtime = runtime
    app.steps["worker"].add(WORKER_STEP)
    return runtime


def runtime_of(app: Any) -> Runtime:
    """The app's runtime; configured from ``app.conf`` alone if ``init_app`` was not called."""
    runtime = getattr(app, "_agentq_runtime", None)
    return runtime if isinstance(runtime, Runtime) else init_app(app)
