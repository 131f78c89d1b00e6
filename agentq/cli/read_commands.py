"""Commands that look without touching: threads, show, history, diff."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Group, RenderableType
from rich.json import JSON
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from agentq.cli.output import (
    ago,
    duration,
    emit_json,
    show_block,
    status_text,
    step_at,
    when,
)
from agentq.cli.session import Session
from agentq.ops.console import console
from agentq.ops.diffing import Change, changed_parts, checkpoint_changes
from agentq.ops.jsonable import plain, short
from agentq.records import MAX_NUMBER, Checkpoint, Status, ThreadMeta

pass_session = click.make_pass_decorator(Session)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
STEP = click.IntRange(min=0, max=MAX_NUMBER)
"""A checkpoint's step as a person gives it; a number past any step is a usage error."""

_HISTORY_PAGE = 100


def _note(meta: ThreadMeta) -> str:
    """The one thing worth knowing about a thread beyond its status."""
    if meta.error:
        return short(meta.error.strip().splitlines()[0], 60)
    if meta.cancel_requested and not meta.status.finished:
        return "cancel requested"
    if meta.status == Status.WAITING and meta.interrupt is not None:
        return "asks: " + short(meta.interrupt, 54)
    if meta.status == Status.DONE:
        return "→ " + short(meta.result, 58)
    return ""


@click.command(short_help="List threads, newest first.")
@click.option(
    "--status", type=click.Choice([s.value for s in Status]), help="Only threads in this status."
)
@click.option(
    "--limit",
    type=click.IntRange(min=1, max=MAX_NUMBER),
    default=50,
    show_default=True,
    help="How many threads, newest first.",
)
@json_option
@pass_session
def threads(session: Session, status: str | None, limit: int, as_json: bool) -> None:
    """List threads, most recently updated first."""
    found = session.store.threads(Status(status) if status else None, limit=limit)
    if as_json:
        emit_json(found)
        return
    out = console()
    if not found:
        out.print("No threads" + (f" in status {status}." if status else "."))
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("THREAD", "STATUS", "STEP", "NODE", "TASK", "UPDATED", "NOTE"):
        table.add_column(
            column, no_wrap=column != "NOTE", justify="right" if column == "STEP" else "left"
        )
    for meta in found:
        # Text, not str: rich would read brackets in ids and errors as markup.
        table.add_row(
            Text(meta.thread_id),
            status_text(meta.status),
            str(step_at(meta)),
            Text(meta.node or "-"),
            Text(meta.task or "-"),
            ago(meta.updated_at),
            Text(_note(meta)),
        )
    show_block(out, table)


def _meta_table(meta: ThreadMeta) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    # As the inspector says it: a thread that stopped in its first node has no checkpoint.
    latest = "no checkpoint yet" if meta.step < 0 else f"latest checkpoint {meta.step}"
    rows: list[tuple[str, RenderableType]] = [
        ("status", status_text(meta.status)),
        ("step", f"{step_at(meta)}  (node {meta.node or '-'}; {latest})"),
        ("task", meta.task or "-"),
        ("attempts", f"{meta.attempts} at this step, {meta.crashes} lost workers"),
        ("fencing token", str(meta.fence)),
        ("created", f"{when(meta.created_at)}  ({ago(meta.created_at)})"),
        ("updated", f"{when(meta.updated_at)}  ({ago(meta.updated_at)})"),
    ]
    if meta.cancel_requested:
        rows.append(("cancel", Text("requested", style="yellow")))
    if meta.input is not None:
        rows.append(("input", JSON.from_data(plain(meta.input))))
    if meta.interrupt is not None:
        rows.append(("waiting for", JSON.from_data(plain(meta.interrupt))))
    waited = "-" if meta.timeout is None else duration(meta.timeout)
    if meta.timeout_at is not None:
        rows.append(("times out", f"{when(meta.timeout_at)}  (a wait of {waited})"))
    if meta.timed_out:
        rows.append(("timed out", Text(f"nobody answered within {waited}", style="yellow")))
    if meta.resumed:
        rows.append(("resume value", JSON.from_data(plain(meta.resume_value))))
    if meta.status == Status.DONE:
        rows.append(("result", JSON.from_data(plain(meta.result))))
    if meta.error:
        rows.append(("error", Text(meta.error.rstrip(), style="red")))
    for name, value in rows:
        table.add_row(name, Text(value) if isinstance(value, str) else value)
    return table


def _checkpoint_view(checkpoint: Checkpoint, latest: bool) -> Panel:
    title = f"checkpoint {checkpoint.step}" + (" (latest)" if latest else "")
    header = Text.assemble(
        ("next node ", "bold"),
        checkpoint.node or "- (finished)",
        ("   written ", "bold"),
        when(checkpoint.created_at),
        ("   by token ", "bold"),
        str(checkpoint.token),
    )
    parts: list[RenderableType] = [header]
    calls = len(checkpoint.pending)
    for name, value in (
        ("state", checkpoint.state),
        (f"pending ({calls} tool call{'' if calls == 1 else 's'})", checkpoint.pending),
        ("cursors", checkpoint.cursors),
    ):
        parts.append(Text(name, style="bold"))
        parts.append(JSON.from_data(plain(value)))
    return Panel(Group(*parts), title=title, title_align="left", expand=False)


@click.command(short_help="Show a thread and its latest (or Nth) checkpoint.")
@click.argument("thread")
@click.option("--step", type=STEP, help="Show this checkpoint instead of the latest.")
@json_option
@pass_session
def show(session: Session, thread: str, step: int | None, as_json: bool) -> None:
    """Show a thread: status, meta, and its latest checkpoint (or --step N)."""
    meta = session.meta(thread)
    store = session.store
    checkpoint = store.latest(thread) if step is None else store.checkpoint(thread, step)
    if as_json:
        emit_json({"meta": meta, "checkpoint": checkpoint})
        return
    out = console()
    out.print(Text.assemble(("thread ", "bold"), (thread, "bold cyan")))
    show_block(out, _meta_table(meta))
    if checkpoint is None:
        out.print("No checkpoint committed yet.")
    else:
        show_block(out, _checkpoint_view(checkpoint, latest=checkpoint.step == meta.step))


def _all_checkpoints(session: Session, thread: str, limit: int | None) -> list[Checkpoint]:
    found: list[Checkpoint] = []
    before = None
    while limit is None or len(found) < limit:
        page = session.store.history(thread, before=before, limit=_HISTORY_PAGE)
        found.extend(page)
        if len(page) < _HISTORY_PAGE:
            break
        before = page[-1].step
    return found if limit is None else found[:limit]


@click.command(short_help="List a thread's checkpoints and what each step changed.")
@click.argument("thread")
@click.option(
    "--limit", type=click.IntRange(min=1, max=MAX_NUMBER), help="Only the newest N checkpoints."
)
@json_option
@pass_session
def history(session: Session, thread: str, limit: int | None, as_json: bool) -> None:
    """List a thread's stored checkpoints, newest first, with what each step changed."""
    session.meta(thread)
    checkpoints = _all_checkpoints(session, thread, limit)
    if as_json:
        emit_json(checkpoints)
        return
    out = console()
    if not checkpoints:
        out.print("No checkpoint committed yet.")
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("STEP", "NEXT NODE", "TOKEN", "WRITTEN", "PENDING", "CHANGED"):
        table.add_column(
            column, justify="right" if column in ("STEP", "TOKEN", "PENDING") else "left"
        )
    for index, checkpoint in enumerate(checkpoints):
        older = checkpoints[index + 1] if index + 1 < len(checkpoints) else None
        if older is not None and older.step == checkpoint.step - 1:
            changed = ", ".join(changed_parts(older, checkpoint)) or "nothing"
        else:
            changed = "(first step)" if checkpoint.step == 0 else "(older steps pruned)"
        table.add_row(
            str(checkpoint.step),
            Text(checkpoint.node or "- (done)"),
            str(checkpoint.token),
            when(checkpoint.created_at),
            str(len(checkpoint.pending)),
            Text(changed),
        )
    show_block(out, table)


_MARKS = {"added": ("+", "green"), "removed": ("-", "red"), "changed": ("~", "yellow")}


def _change_line(change: Change) -> Text:
    mark, style = _MARKS[change.kind]
    line = Text(f"{mark} ", style=style)
    line.append(change.path, style="bold")
    line.append("  ")
    if change.kind == "added":
        line.append(short(change.after, 100), style=style)
    elif change.kind == "removed":
        line.append(short(change.before, 100), style=style)
    else:
        line.append(short(change.before, 60), style="red")
        line.append(" → ")
        line.append(short(change.after, 60), style="green")
    return line


@click.command(short_help="Compare two checkpoints of a thread.")
@click.argument("thread")
@click.argument("a", type=STEP)
@click.argument("b", type=STEP)
@json_option
@pass_session
def diff(session: Session, thread: str, a: int, b: int, as_json: bool) -> None:
    """Show what changed between checkpoints A and B of THREAD: the next node, the state,
    the pending tool calls and the cursors, path by path."""
    session.meta(thread)
    old, new = session.store.checkpoint(thread, a), session.store.checkpoint(thread, b)
    changes = checkpoint_changes(old, new)
    if as_json:
        emit_json({"thread_id": thread, "from": a, "to": b, "changes": changes})
        return
    out = console()
    out.print(Text.assemble(("diff ", "bold"), (thread, "bold cyan"), f"  step {a} → step {b}"))
    if not changes:
        out.print("No differences in node, state, pending or cursors.")
    for change in changes:
        out.print(_change_line(change), soft_wrap=True)


READ_COMMANDS: tuple[Any, ...] = (threads, show, history, diff)
