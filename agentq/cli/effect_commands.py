"""Commands for a thread's tool calls: list their records, settle one no worker recorded."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table
from rich.text import Text

from agentq.cli.control_commands import parse_json, queued_outcome, report_queued
from agentq.cli.output import ago, emit_json, show_block
from agentq.cli.read_commands import json_option, pass_session
from agentq.cli.session import Session
from agentq.ids import downstream_key
from agentq.ops.console import console
from agentq.ops.control import settle
from agentq.ops.jsonable import plain, short
from agentq.records import Effect, EffectState
from agentq.store.contract import UNSET


@click.command(short_help="List a thread's tool calls and their records.")
@click.argument("thread")
@click.option(
    "--shared",
    "shared_key",
    metavar="KEY",
    help="Show the shared record KEY instead (a tool declared shared=True keeps one for "
    "every thread that uses the key), with the thread that claimed it.",
)
@json_option
@pass_session
def effects(session: Session, thread: str, shared_key: str | None, as_json: bool) -> None:
    """List every effect record of THREAD: its key, the idempotency key its tool sent
    downstream (look the call up at the service by it), the tool, when it was claimed,
    whether its outcome was recorded (done) or is unknown (pending: claimed by a worker
    that stopped before recording it), the fencing token of the worker that claimed it,
    and the recorded result. With --shared KEY, the shared record KEY that THREAD uses
    (its needs_attention error names it)."""
    meta = session.meta(thread)
    shared = shared_key is not None
    if shared_key is not None:
        record = session.store.effect(thread, shared_key, shared=True)
        found = [] if record is None else [record]
    else:
        found = session.store.effects(thread)

    namespace = session.store.key_namespace
    incarnation = None if shared else meta.incarnation

    def sent_as(effect: Effect) -> str:
        # From the meta read above: a page of records costs no round trip per record.
        return downstream_key(namespace, thread, effect.key, shared=shared, incarnation=incarnation)

    if as_json:
        emit_json([{**plain(e), "sent_as": sent_as(e)} for e in found])
        return
    out = console()
    if not found:
        if shared:
            out.print(
                f"No shared record {shared_key!r}: no thread claimed it, or it was settled "
                "as not run.",
                markup=False,
            )
        else:
            out.print(f"{thread} has no effect records.", markup=False)
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    columns = ["KEY", "SENT AS", "TOOL", "CLAIMED", "STATE", "TOKEN", "RESULT"]
    if shared:
        # Tokens count per thread: the token alone does not say whose worker claimed it.
        columns.insert(4, "BY THREAD")
    for column in columns:
        table.add_column(column, no_wrap=column != "RESULT")
    for effect in found:
        pending = effect.state == EffectState.PENDING
        row: list[str | Text] = [
            Text(effect.key),
            sent_as(effect),
            Text(effect.tool or "-"),
            "-" if effect.claimed_at is None else ago(effect.claimed_at),
            Text(effect.state.value, style="bold magenta" if pending else "green"),
            str(effect.token),
            Text("outcome unknown" if pending else short(effect.result, 60)),
        ]
        if shared:
            row.insert(4, Text(effect.claimed_by or "-"))
        table.add_row(*row)
    show_block(out, table)
    if any(effect.state == EffectState.PENDING for effect in found) and not meta.status.is_live:
        which = (
            f"it with: agentq resolve {thread} {shared_key} --shared"
            if shared
            else (f"a pending one with: agentq resolve {thread} KEY")
        )
        out.print(
            f"Settle {which} --result JSON (what it did) or --did-not-run (it runs once more).",
            markup=False,
        )


@click.command(short_help="Settle a tool call whose outcome no worker recorded.")
@click.argument("thread")
@click.argument("key")
@click.option(
    "--result",
    metavar="JSON",
    callback=parse_json,
    help="What the call did, as JSON: the node gets it as the tool's result.",
)
@click.option("--did-not-run", is_flag=True, help="The call had no effect: run it once more.")
@click.option(
    "--shared",
    is_flag=True,
    help="KEY is a shared record (of a tool declared shared=True), which every thread using "
    "the key finds: refused while the thread that claimed it runs.",
)
@json_option
@pass_session
def resolve(
    session: Session,
    thread: str,
    key: str,
    result: Any,
    did_not_run: bool,
    shared: bool,
    as_json: bool,
) -> None:
    """Settle the pending tool call KEY of THREAD (needs_attention or failed) once you
    checked what it did, then run the thread on from its latest checkpoint. Refused while
    a worker holds the thread, or (--shared) the thread that claimed KEY."""
    given = click.get_current_context().get_parameter_source("result")
    has_result = given is not None and given.name != "DEFAULT"
    if has_result == did_not_run:
        raise click.UsageError("give exactly one of --result JSON and --did-not-run")
    session.meta(thread)
    app = session.app
    settled = settle(
        session.store,
        app,
        thread,
        key,
        result=result if has_result else UNSET,
        did_not_run=did_not_run,
        start_grace=session.settings.start_grace,
        shared=shared,
    )
    report_queued(settled, queued_outcome(settled, key=key), f"Settled {key} of", as_json)


EFFECT_COMMANDS: tuple[Any, ...] = (effects, resolve)
