"""The command group: every failure becomes one line on stderr and a non-zero exit."""

from __future__ import annotations

import os
import sqlite3
import sys
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

import click

from agentq.errors import AgentqError

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE: what a shell reports for a tool its reader (``| head``) went away from."""
TRACEBACK_ENV = "AGENTQ_TRACEBACK"
_NO_ARGS_IS_HELP: Any = getattr(click.exceptions, "NoArgsIsHelpError", ())
"""What click 8.2 and later raise for a group run without a command (earlier ones print
the help and exit by themselves)."""


def describe(exc: BaseException) -> str | None:
    """A one-line account of an expected failure; ``None`` for a bug."""
    import kombu.exceptions
    import redis.exceptions

    from agentq.cli.session import CliError

    if isinstance(exc, CliError | AgentqError):
        return str(exc)
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        return f"cannot reach the store: {exc}"
    if isinstance(exc, redis.exceptions.RedisError):
        return f"the store refused: {type(exc).__name__}: {exc}"
    if isinstance(exc, sqlite3.Error):
        return f"SQLite store error: {exc}"
    if isinstance(exc, kombu.exceptions.OperationalError):
        return f"cannot reach the broker: {exc}"
    if isinstance(exc, OSError):
        return f"{type(exc).__name__}: {exc}"
    return None


def fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    line = " ".join(message.split())
    click.echo(click.style(f"agentq: {line}", fg="red"), err=True)
    raise click.exceptions.Exit(code)


def _usage_line(exc: click.ClickException) -> str:
    message = exc.format_message()
    ctx = getattr(exc, "ctx", None)
    if isinstance(exc, click.UsageError) and ctx is not None:
        message += f" (see '{ctx.command_path} --help')"
    return message


def stop_writing() -> NoReturn:
    """Exit quietly once stdout's reader has gone: what is left to write goes to
    /dev/null, so the interpreter's last flush cannot fail again at exit."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    raise click.exceptions.Exit(EXIT_BROKEN_PIPE)


def report(exc: BaseException) -> NoReturn:
    """Print ``exc`` as one line and exit; a bug's traceback only when asked for."""
    if isinstance(exc, click.exceptions.Exit):
        raise exc
    if isinstance(exc, BrokenPipeError):
        stop_writing()
    if isinstance(exc, _NO_ARGS_IS_HELP):
        exc.show()  # the help on its lines, not folded into one error line
        raise click.exceptions.Exit(exc.exit_code)
    if isinstance(exc, click.ClickException):
        fail(_usage_line(exc), exc.exit_code)
    if isinstance(exc, click.Abort | KeyboardInterrupt):
        fail("interrupted", EXIT_INTERRUPTED)
    message = describe(exc)
    if message is not None:
        fail(message)
    if os.environ.get(TRACEBACK_ENV):
        raise exc
    fail(
        f"internal error: {type(exc).__name__}: {exc} (set {TRACEBACK_ENV}=1 for the "
        "traceback, and please report it)"
    )


class AgentqGroup(click.Group):
    """A click group whose errors, from parsing to the store, print one line, never a
    traceback: standalone (``agentq``) and mounted under ``celery``."""

    def main(
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            sys.stdout.flush()  # a pipe's buffer is written here, while errors are caught
        except click.exceptions.Exit as exit_:
            code = exit_.exit_code
        except (Exception, KeyboardInterrupt) as exc:
            try:
                report(exc)
            except click.exceptions.Exit as exit_:
                code = exit_.exit_code
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.ClickException as exc:
            report(exc)  # mounted under celery: celery's main would print several lines

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.Exit:
            raise
        except (Exception, KeyboardInterrupt) as exc:
            report(exc)


class LazyGroup(AgentqGroup):
    """A group whose commands are imported when first looked up: ``celery`` loads the
    ``agentq`` group for every command it runs (``celery -A otherapp worker`` too), which
    must not import agentq's commands, its stores and rich."""

    def __init__(
        self, *args: Any, commands: Callable[[], Iterable[click.Command]], **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._commands: Callable[[], Iterable[click.Command]] | None = commands

    def _load(self) -> None:
        if self._commands is not None:
            for command in self._commands():
                self.add_command(command)
            self._commands = None

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._load()
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        self._load()
        return super().get_command(ctx, cmd_name)
