"""The ``agentq`` command line, also mounted as ``celery -A proj agentq`` (through the
``celery.commands`` entry point)."""

from agentq.cli.entry import celery_command, cli, main

__all__ = ["celery_command", "cli", "main"]
