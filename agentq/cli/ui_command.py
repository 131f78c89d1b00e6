"""``agentq ui``: serve the web inspector over the session's store."""

from __future__ import annotations

import os
import socket

import click

from agentq.cli.read_commands import pass_session
from agentq.cli.session import CliError, Session
from agentq.errors import missing_extra


@click.command(short_help="Serve the web inspector for threads.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8765, show_default=True, help="0: any free."
)
@click.option("--read-only", is_flag=True, help="Show threads, offer no action.")
@pass_session
def ui(session: Session, host: str, port: int, read_only: bool) -> None:
    """Serve a web page of the store's threads: counts per status, a filterable list,
    each thread's checkpoints, diffs, effects, lease and error, and (unless --read-only)
    resume, retry, cancel, fork and settle, each confirmed first.

    On loopback (the default) anyone on this machine may use it. On any other address
    every request needs the access token: set AGENTQ_UI_TOKEN, or use the link printed
    at start. Needs the extra: pip install 'agentq[ui]'."""
    try:
        import uvicorn

        from agentq.ui import create_app
        from agentq.ui.security import TOKEN_ENV, is_loopback, new_secret
    except ModuleNotFoundError as exc:
        raise CliError(str(missing_extra("the inspector", "ui", exc))) from exc
    loopback = is_loopback(host)
    token = os.environ.get(TOKEN_ENV) or None
    printed_token = token is None and not loopback
    if printed_token:
        token = new_secret()
    web = create_app(
        session.store,
        app=session.app,
        start_grace=session.settings.start_grace,
        read_only=read_only,
        token=token,
        loopback=loopback,
    )
    address = host.strip("[]")  # [::1] as a URL writes it, or ::1
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        listener = socket.create_server((address, port), family=family)
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc}") from exc
    bound = listener.getsockname()[1]
    shown = f"[{address}]" if ":" in address else address
    link = f"http://{shown}:{bound}/" + (f"?token={token}" if printed_token else "")
    notes = [session.store_label]
    if read_only:
        notes.append("read-only")
    if token is not None and not printed_token:
        notes.append(f"token from {TOKEN_ENV}")
    click.echo(f"agentq ui on {link} ({', '.join(notes)}); Ctrl-C stops it", err=False)
    config = uvicorn.Config(
        web, log_level="warning", lifespan="off", server_header=False, access_log=False
    )
    uvicorn.Server(config).run(sockets=[listener])
