"""Commands for operators: gc, doctor, sweep."""

from __future__ import annotations

import contextlib
import json
import math
import signal
import time
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.text import Text

from agentq.cli.group import describe
from agentq.cli.output import ago, duration, emit_json
from agentq.cli.read_commands import json_option, pass_session
from agentq.cli.session import Session
from agentq.ops import gc as cleanup
from agentq.ops import latency
from agentq.ops.console import console
from agentq.records import Finding, Status, ThreadMeta

if TYPE_CHECKING:
    from rich.console import Console

    from agentq.celery.recovery import Sweeper

SLOW_COMMIT_MS = 50.0
"""A commit slower than this is worth a note: every step of every agent pays it once."""


class Seconds(click.FloatRange):
    """A duration in seconds from ``min`` up. ``float()`` reads "nan" and "inf" too, and
    a range lets NaN through (every comparison with it is false): neither is a duration
    a store can compare times with."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(
                f"{value!r} is not a finite number of seconds; give one such as 3600", param, ctx
            )
        return seconds


@click.command(short_help="Delete finished threads past their retention.")
@click.option(
    "--older-than",
    type=Seconds(min=0),
    metavar="SECONDS",
    help="Delete threads finished longer ago than this (default: the "
    "finished_ttl setting, 7 days unless configured).",
)
@click.option(
    "--include",
    "included",
    multiple=True,
    type=click.Choice(sorted(s.value for s in cleanup.KEPT_UNLESS_ASKED)),
    help="Delete threads in this status too (repeatable); they are kept by default, "
    "since someone may still look into them.",
)
@click.option("--dry-run", is_flag=True, help="List what would be deleted; delete nothing.")
@json_option
@pass_session
def gc(
    session: Session,
    older_than: float | None,
    included: tuple[str, ...],
    dry_run: bool,
    as_json: bool,
) -> None:
    """Delete done and cancelled threads past their retention, with every checkpoint and
    effect record they own (failed and needs_attention ones only with --include).
    Workers' sweepers also delete finished threads, failed ones included, once they are
    older than finished_ttl."""
    ttl = session.settings.finished_ttl if older_than is None else older_than
    statuses = {Status.DONE, Status.CANCELLED, *(Status(s) for s in included)}
    store = session.store
    if dry_run:
        _preview(cleanup.candidates(store, time.time() - ttl, statuses), ttl, as_json)
        return
    err = console(stderr=True)
    if as_json or not err.is_terminal:
        removed = cleanup.collect(store, ttl, statuses)
    else:
        with Progress(
            TextColumn("deleting finished threads"),
            BarColumn(),
            MofNCompleteColumn(),
            console=err,
            transient=True,
        ) as progress:
            bar = progress.add_task("gc", total=None, visible=False)

            def show(done: int, expected: int) -> None:
                # A bar for a handful of threads would only flicker.
                visible = expected > cleanup.CHUNK
                progress.update(bar, completed=done, total=expected, visible=visible)

            removed = cleanup.collect(store, ttl, statuses, show)
    if as_json:
        emit_json({"removed": removed, "older_than": ttl})
        return
    console().print(
        f"Removed {removed} finished thread{'s' if removed != 1 else ''} "
        f"older than {duration(ttl)}."
    )


def _preview(found: list[ThreadMeta], ttl: float, as_json: bool) -> None:
    if as_json:
        emit_json({"would_remove": [meta.thread_id for meta in found], "older_than": ttl})
        return
    out = console()
    for meta in found:
        out.print(Text(f"{meta.thread_id}  {meta.status.value}  updated {ago(meta.updated_at)}"))
    out.print(
        f"Would remove {len(found)} thread{'s' if len(found) != 1 else ''} older than "
        f"{duration(ttl)} (dry run: nothing deleted)."
    )


def _finding_rows(findings: list[Finding]) -> list[str]:
    return [
        f"  [red]✗[/] [bold]{escape(f.setting)}[/]={escape(f.value)}: "
        f"{escape(f.problem)}\n    [green]fix:[/] {escape(f.fix)}"
        for f in findings
    ]


def _print_doctor(
    session: Session,
    store_findings: list[Finding],
    trips: list[latency.RoundTrips],
    latency_error: str | None,
    app: Any,
    app_findings: list[Finding] | None,
    unused: list[Finding] | None,
) -> None:
    out = console()
    out.print(f"[bold]Store[/] {escape(session.store_label)} ({type(session.store).__name__})")
    for row in _finding_rows(store_findings) or [
        "  [green]✓[/] durability and eviction: nothing to fix"
    ]:
        out.print(row)
    out.print(
        f"[bold]Round trips[/] ({latency.ROUNDS} each, on a scratch thread, deleted afterwards)"
    )
    if latency_error is not None:
        out.print(f"  [red]✗[/] could not write a checkpoint: {escape(latency_error)}")
    for trip in trips:
        note = ""
        if trip.operation == "commit" and trip.median_ms > SLOW_COMMIT_MS:
            note = "  [yellow]slow: every step of every agent waits for one commit[/]"
        out.print(
            f"  {trip.operation:<7} median {trip.median_ms:7.2f} ms   worst "
            f"{trip.worst_ms:7.2f} ms{note}"
        )
    if app_findings is None:
        out.print("[bold]Celery[/] skipped: pass -A module:app to check your app's settings")
        return
    out.print(f"[bold]Celery[/] app {escape(str(app.main))}")
    for row in _finding_rows(app_findings) or ["  [green]✓[/] settings: nothing to fix"]:
        out.print(row)
    if unused is not None:
        out.print("[bold]Limits[/] (taken from in this store; a fresh store has none yet)")
        for row in _finding_rows(unused) or ["  [green]✓[/] every declared limit is used"]:
            out.print(row)


@contextlib.contextmanager
def _terminated_as_exit() -> Iterator[None]:
    """SIGTERM (``timeout``, a container stopping) ends the probe as Ctrl-C does, so that
    it deletes its scratch thread: left running, a sweeper would send it to workers that
    have no task of that name, over and over. Run on a slow store, that is when the probe
    is most likely to be stopped."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@click.command(short_help="Check the store, its latency and the Celery settings.")
@json_option
@pass_session
def doctor(session: Session, as_json: bool) -> None:
    """Check the store's durability and eviction settings, its round-trip latency, and
    (with -A) the Celery settings that recovery depends on. Exits 1 if anything needs a
    fix."""
    from agentq.ops.doctor import celery_findings, unused_limits

    store = session.open_store(check=False)
    store_findings = store.check()
    trips: list[latency.RoundTrips] = []
    latency_error = None
    try:
        with _terminated_as_exit():
            trips = latency.measure(store)
    except Exception as exc:  # a store that cannot take writes is a diagnosis, not a crash
        latency_error = describe(exc)
        if latency_error is None:
            raise
    app = session.app
    app_findings = celery_findings(app, session.settings) if app is not None else None
    limits = session.settings.declared_limits
    # Not a failure: a fleet that has made no calls yet has used none of its limits.
    unused = unused_limits(limits, store.limit_takes()) if app is not None and limits else None
    healthy = not store_findings and not app_findings and latency_error is None
    if as_json:
        emit_json(
            {
                "store": {
                    "url": session.store_label,
                    "backend": type(store).__name__,
                    "findings": store_findings,
                },
                "latency_ms": {
                    t.operation: {
                        "median": t.median_ms,
                        "worst": t.worst_ms,
                        "samples": t.samples_ms,
                    }
                    for t in trips
                },
                "latency_error": latency_error,
                "celery": None
                if app_findings is None
                else {"app": app.main, "findings": app_findings},
                "unused_limits": unused,
                "ok": healthy,
            }
        )
    else:
        _print_doctor(session, store_findings, trips, latency_error, app, app_findings, unused)
    if not healthy:
        raise click.exceptions.Exit(1)


@click.command(short_help="Re-send due threads (recovery) from outside the workers.")
@click.option("--once", is_flag=True, help="Sweep once and exit.")
@click.option(
    "--interval",
    type=Seconds(min=0.01),
    metavar="SECONDS",
    help="Time between sweeps (default: the sweep_interval setting).",
)
@json_option
@pass_session
def sweep(session: Session, once: bool, interval: float | None, as_json: bool) -> None:
    """Re-send every thread that is due (its worker died, its retry timer ran out, its
    message was lost), as the sweeper inside every worker does; for when no worker runs
    one, or to see what recovery does. Needs -A: it sends messages."""
    from agentq.celery.recovery import Sweeper

    app = session.require_app("sweep")
    label = session.store_label
    _ = session.store  # opened now: a bad store fails here, not inside the loop
    sweeper = Sweeper(app)
    out = console()
    if once:
        _sweep_once(sweeper, out, as_json)
        return
    every = interval or session.settings.sweep_interval
    if not as_json:
        out.print(f"Sweeping {escape(label)} every {every:g} s; Ctrl-C to stop.")
    try:
        while True:
            _report_sent(out, _sweep_or_warn(sweeper, every), as_json)
            time.sleep(every)
    except KeyboardInterrupt:
        if not as_json:
            out.print("Stopped.")


def _sweep_once(sweeper: Sweeper, out: Console, as_json: bool) -> None:
    sent = sweeper.sweep_once()
    if as_json:
        emit_json({"sent": sent})
    elif sent:
        for thread in sent:
            out.print(f"re-sent [bold cyan]{escape(thread)}[/]")
    else:
        out.print("Nothing due.")


def _sweep_or_warn(sweeper: Sweeper, every: float) -> list[str]:
    """One sweep of the loop; a store that is down for a moment is reported, not fatal."""
    try:
        return sweeper.sweep_once()
    except Exception as exc:
        problem = describe(exc)
        if problem is None:
            raise
        console(stderr=True).print(
            f"[yellow]sweep failed:[/] {escape(problem)}; trying again in {every:g} s"
        )
        return []


def _report_sent(out: Console, sent: list[str], as_json: bool) -> None:
    for thread in sent:
        if as_json:  # one object per line, for a log pipeline
            click.echo(json.dumps({"at": time.time(), "sent": thread}))
        else:
            stamp = time.strftime("%H:%M:%S")
            out.print(f"{stamp} re-sent [bold cyan]{escape(thread)}[/]")


OPS_COMMANDS: tuple[Any, ...] = (gc, doctor, sweep)
