"""The app a benchmark's ``celery worker`` subprocess loads (``-A bench._worker_app``),
configured from the environment by :mod:`bench._cluster`."""

from __future__ import annotations

from bench._agents import app_from_env

app = app_from_env()
