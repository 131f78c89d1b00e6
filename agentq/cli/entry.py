"""The ``agentq`` command, and the same commands as ``celery -A proj agentq``."""

from __future__ import annotations

import functools
from typing import Any

import click

from agentq.cli.group import LazyGroup

_CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

store_option = click.option(
    "--store",
    "store_url",
    envvar="AGENTQ_STORE",
    metavar="URL",
    help="The store: redis://host:6379/1, rediss://..., unix://... or sqlite:///path.db "
    "[env AGENTQ_STORE]. With an app, overrides its agentq_store.",
)
prefix_option = click.option(
    "--prefix",
    envvar="AGENTQ_PREFIX",
    help="Key prefix of a Redis store (default agentq:) [env AGENTQ_PREFIX].",
)
unsafe_option = click.option(
    "--allow-unsafe-store",
    is_flag=True,
    envvar="AGENTQ_ALLOW_UNSAFE_STORE",
    help="Open a store that would lose checkpoints (evicting, no persistence), for "
    "development; without it such a store is refused [env AGENTQ_ALLOW_UNSAFE_STORE].",
)


@functools.cache
def _celery_commands() -> tuple[click.Command, ...]:
    """The commands of both groups, with the late options (added once: they are shared)."""
    from agentq.cli.control_commands import CONTROL_COMMANDS
    from agentq.cli.effect_commands import EFFECT_COMMANDS
    from agentq.cli.limit_commands import LIMIT_COMMANDS
    from agentq.cli.ops_commands import OPS_COMMANDS
    from agentq.cli.read_commands import READ_COMMANDS
    from agentq.cli.ui_command import ui

    commands = (
        *READ_COMMANDS,
        *CONTROL_COMMANDS,
        *EFFECT_COMMANDS,
        *OPS_COMMANDS,
        *LIMIT_COMMANDS,
        ui,
    )
    for command in commands:
        command.params.extend(_LATE_OPTIONS)
    return commands


def _agentq_commands() -> tuple[click.Command, ...]:
    from agentq.cli.demo_command import demo

    return (*_celery_commands(), demo)


@click.group(cls=LazyGroup, context_settings=_CONTEXT, commands=_agentq_commands)
@click.option(
    "-A",
    "--app",
    "app_path",
    envvar="AGENTQ_APP",
    metavar="MODULE:APP",
    help="Your Celery app, for commands that send messages (resume, retry, "
    "sweep) and for doctor's Celery checks; its agentq settings name the "
    "store [env AGENTQ_APP].",
)
@store_option
@prefix_option
@unsafe_option
@click.version_option(package_name="agentq", prog_name="agentq")
@click.pass_context
def cli(
    ctx: click.Context,
    app_path: str | None,
    store_url: str | None,
    prefix: str | None,
    allow_unsafe_store: bool,
) -> None:
    """Inspect and operate durable agent threads.

    \b
    Try it first:   agentq demo
    Then:           agentq --store redis://localhost:6379/1 threads
    """
    from agentq.cli.session import Session

    session = Session(
        store_url=store_url,
        prefix=prefix,
        app_path=app_path,
        allow_unsafe_store=allow_unsafe_store,
    )
    ctx.obj = session
    ctx.call_on_close(session.close)


@click.group("agentq", cls=LazyGroup, context_settings=_CONTEXT, commands=_celery_commands)
@store_option
@prefix_option
@unsafe_option
@click.pass_context
def celery_command(
    ctx: click.Context, store_url: str | None, prefix: str | None, allow_unsafe_store: bool
) -> None:
    """Inspect and operate agentq threads of this app (its agentq settings name the store)."""
    from agentq.cli.session import Session

    app: Any = getattr(ctx.obj, "app", None)
    root = ctx.find_root()
    if root is not ctx and root.params.get("app") is None and root.params.get("config") is None:
        # Without -A celery hands over its default app, whose default store is a SQLite
        # file in the working directory: ask for the app or the store, as 'agentq' does.
        # Called on its own, as a program embedding it does, the app it is given stands.
        app = None
    session = Session(
        store_url=store_url, prefix=prefix, app=app, allow_unsafe_store=allow_unsafe_store
    )
    ctx.obj = session
    ctx.call_on_close(session.close)


def _late_app(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    from agentq.cli.session import Session

    session = ctx.find_object(Session)
    if value is not None and session is not None:
        session.use_app_path(value)


def _late_store(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    from agentq.cli.session import Session

    session = ctx.find_object(Session)
    if value is not None and session is not None:
        session.store_url = value


def _late_prefix(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    from agentq.cli.session import Session

    session = ctx.find_object(Session)
    if value is not None and session is not None:
        session.prefix = value


def _late_unsafe(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    from agentq.cli.session import Session

    session = ctx.find_object(Session)
    if value and session is not None:
        session.allow_unsafe_store = True


# The group's options after the command too, where people type them from habit
# ('agentq ui --store URL'). Without an environment variable of their own: given here they
# win over the one the group read.
_LATE_OPTIONS = (
    click.Option(
        ["-A", "--app"],
        metavar="MODULE:APP",
        expose_value=False,
        callback=_late_app,
        help="Your Celery app, as before the command.",
    ),
    click.Option(
        ["--store"],
        metavar="URL",
        expose_value=False,
        callback=_late_store,
        help="The store, as before the command.",
    ),
    click.Option(
        ["--prefix"],
        expose_value=False,
        callback=_late_prefix,
        help="Key prefix of a Redis store, as before the command.",
    ),
    click.Option(
        ["--allow-unsafe-store"],
        is_flag=True,
        expose_value=False,
        callback=_late_unsafe,
        help="Open a store that would lose checkpoints, as before the command.",
    ),
)


def main() -> None:
    """The console script."""
    cli.main(prog_name="agentq")
