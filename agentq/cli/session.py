"""What a command works on: the store, and the Celery app when one was given."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from kombu.utils.url import maybe_sanitize_url

from agentq.celery.runtime import Runtime, init_app, runtime_of
from agentq.celery.store_guard import refuse_unsafe_store
from agentq.errors import ThreadNotFound
from agentq.ids import validate_thread_id
from agentq.records import ThreadMeta
from agentq.settings import Settings
from agentq.store.contract import Store
from agentq.store.sqlite.store import path_of_url


class CliError(Exception):
    """A problem with what the user asked for, reported as one line, exit status 1."""


class Session:
    """Opens the store and loads the app on first use, so ``--help`` and bad arguments
    never wait for a connection.

    With an app, its agentq settings name the store; ``--store``/``--prefix`` (or
    ``AGENTQ_STORE``/``AGENTQ_PREFIX``) override them, for this process only, so the
    messages a command sends and the store it reads always agree.
    ``allow_unsafe_store`` (``--allow-unsafe-store``) opens a store that would lose
    checkpoints, as the setting of that name does.
    """

    def __init__(
        self,
        *,
        store_url: str | None = None,
        prefix: str | None = None,
        app_path: str | None = None,
        app: Any = None,
        allow_unsafe_store: bool = False,
    ) -> None:
        self.store_url = store_url
        self.prefix = prefix
        self.allow_unsafe_store = allow_unsafe_store
        self._app_path = app_path
        self._app = app
        self._app_ready = False
        self._store: Store | None = None

    # -- the app -----------------------------------------------------------------------------

    @property
    def app(self) -> Any:
        """The Celery app with the store override applied, or ``None`` without one."""
        if self._app is None and self._app_path is not None:
            self._app = _load_app(self._app_path)
        if self._app is not None and not self._app_ready:
            self._app_ready = True
            if self.store_url is not None or self.prefix is not None:
                self._override_store(self._app)
        return self._app

    def use_app_path(self, app_path: str) -> None:
        """Take ``-A`` given after the command (it wins over ``AGENTQ_APP``), before
        anything was loaded."""
        if self._app is not None and self._app_path is None:
            raise CliError("the app comes from celery here: write -A before 'agentq'")
        self._app_path = app_path

    def require_app(self, purpose: str) -> Any:
        app = self.app
        if app is None:
            raise CliError(
                f"{purpose} needs your Celery app: pass -A module:app (or run "
                "'celery -A proj agentq ...')"
            )
        return app

    def _override_store(self, app: Any) -> None:
        current = runtime_of(app).settings
        values = {name: getattr(current, name) for name in Settings.names()}
        if self.store_url is not None:
            values["store"] = self.store_url
        if self.prefix is not None:
            values["prefix"] = self.prefix
        init_app(app, **values)

    # -- the store ---------------------------------------------------------------------------

    @property
    def settings(self) -> Settings:
        """The app's agentq settings, or the defaults around the given store."""
        if self.app is not None:
            return runtime_of(self.app).settings
        if self.store_url is None:
            raise CliError(
                "no store given: pass --store URL (or set AGENTQ_STORE), e.g. "
                "--store redis://localhost:6379/1, or -A module:app to use your app's "
                "agentq settings"
            )
        return Settings(store=self.store_url, prefix=self.prefix or Settings.prefix)

    @property
    def store(self) -> Store:
        """The store, refused if its checks find it would lose checkpoints (unless the
        ``allow_unsafe_store`` setting says otherwise)."""
        return self.open_store(check=True)

    def open_store(self, *, check: bool) -> Store:
        """The store; ``check=False`` for doctor, which reports what the check finds."""
        if self._store is None:
            settings = self.settings
            if isinstance(settings.store, str):
                _refuse_missing_sqlite_file(settings.store)
            runtime = runtime_of(self.app) if self.app is not None else Runtime(settings)
            store = runtime.store
            if check:
                try:
                    refuse_unsafe_store(store, self._checked_settings(settings))
                except BaseException:
                    if self.app is None:
                        store.close()
                    raise
            self._store = store
        return self._store

    def _checked_settings(self, settings: Settings) -> Settings:
        if self.allow_unsafe_store and not settings.allow_unsafe_store:
            return dataclasses.replace(settings, allow_unsafe_store=True)
        return settings

    @property
    def store_label(self) -> str:
        """The store's URL with any password hidden, for output."""
        store = self.settings.store
        return (
            maybe_sanitize_url(store, mask="***")
            if isinstance(store, str)
            else type(store).__name__
        )

    def meta(self, thread_id: str) -> ThreadMeta:
        """The thread's meta; a clear error when the store does not hold it."""
        meta = self.store.meta(validate_thread_id(thread_id))
        if meta is None:
            raise ThreadNotFound(
                f"no such thread in {self.store_label}; list them with 'agentq threads'",
                thread_id=thread_id,
            )
        return meta

    def close(self) -> None:
        # A store the app owns stays open with the app; only ours is closed.
        if self._store is not None and self._app is None:
            self._store.close()
        self._store = None


def _load_app(path: str) -> Any:
    from celery import Celery
    from celery.app.utils import find_app

    try:
        app = find_app(path)
    except Exception as exc:  # user code: anything can go wrong on import
        raise CliError(
            f"cannot load the Celery app {path!r}: {type(exc).__name__}: {exc}; give it as "
            "module:attribute, importable from the current directory"
        ) from exc
    if not isinstance(app, Celery):
        raise CliError(
            f"{path!r} is a {type(app).__name__}, not a Celery app; give the app as "
            "module:attribute"
        )
    return app


def _refuse_missing_sqlite_file(url: str) -> None:
    # Opening a missing SQLite file would create an empty store, and a mistyped path would
    # quietly show no threads.
    if not url.startswith("sqlite:"):
        return
    path = path_of_url(url)
    if path and not os.path.exists(path):
        raise CliError(
            f"no SQLite store at {os.path.abspath(path)!r}: the file does not exist; check "
            "the path (sqlite:///relative.db or sqlite:////absolute.db)"
        )
