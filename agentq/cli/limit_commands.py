"""``agentq limits``: each declared budget and what the fleet uses of it now."""

from __future__ import annotations

import time
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from agentq.cli.output import emit_json
from agentq.cli.read_commands import json_option, pass_session
from agentq.cli.session import Session
from agentq.errors import LimitError
from agentq.limits import Limits
from agentq.ops.console import console
from agentq.store.contract.limits import LimitState
from agentq.store.contract.thread_keys import KeyState


def _threads(row: dict[str, Any], keyed: KeyState | None, now: float) -> None:
    """The concurrency key's side of a row: the threads running, those waiting."""
    row["running_threads"] = keyed.running if keyed else []
    row["waiting"] = [
        {
            "thread_id": waiter.thread_id,
            "position": waiter.position,
            "since": waiter.since,
            "waited": max(0.0, now - waiter.since),
        }
        for waiter in (keyed.waiting if keyed else [])
    ]


def _row(key: str, declared: str, limits: Limits, state: LimitState | None) -> dict[str, Any]:
    limit = limits.of(key)
    row: dict[str, Any] = {
        "key": key,
        "declared": declared,
        "requests_per_minute": limit.requests_per_minute,
        "tokens_per_minute": limit.tokens_per_minute,
        "concurrency": limit.concurrency,
        "threads": limit.threads,
        "requests_left": None,
        "tokens_left": None,
        "in_flight": 0,
        "paused_for": 0.0,
    }
    if state is not None:
        row.update(
            requests_left=state.requests_left(limit),
            tokens_left=state.tokens_left(limit),
            in_flight=state.in_flight,
            paused_for=max(0.0, state.paused - state.now),
        )
    elif limit.requests_per_minute is not None:
        row["requests_left"] = limit.request_burst
        row["tokens_left"] = limit.tokens_per_minute
    return row


def _rows(session: Session) -> list[dict[str, Any]]:
    declared = session.settings.declared_limits
    states = session.store.limit_states()
    keyed = {state.key: state for state in session.store.key_states()}
    now = time.time()
    rows = []
    for name in declared.declared():
        if declared.declared()[name].is_family:
            continue
        rows.append(_row(name, name, declared, states.get(name)))
    for key in sorted(states.keys() | keyed.keys()):
        if key in declared.declared():
            continue
        try:
            family = declared.of(key)
        except LimitError:
            continue  # used once, no longer declared
        rows.append(_row(key, family.name, declared, states.get(key)))
    for row in rows:
        _threads(row, keyed.get(row["key"]), now)
    return rows


@click.command(short_help="Show each rate limit's budget and what is used of it.")
@json_option
@pass_session
def limits(session: Session, as_json: bool) -> None:
    """Each limit the app declares (and each key of a family that was taken from or
    that threads run under): its budget, what is left of it now, the calls holding its
    slots, how long a provider's 429 still pauses it, and the threads of its
    concurrency key running and waiting (first to start first)."""
    session.require_app("limits")  # the app's settings declare them, not the store
    rows = _rows(session)
    if as_json:
        emit_json(rows)
        return
    if not rows:
        console().print("no limits declared: add agentq.limit(...) to init_app(app, limits=[...])")
        return
    table = Table("key", "budget", "requests left", "tokens left", "in flight", "threads", "paused")
    for row in rows:
        budget = ", ".join(
            f"{row[name]:g} {unit}"
            for name, unit in (
                ("requests_per_minute", "req/min"),
                ("tokens_per_minute", "tok/min"),
                ("concurrency", "at once"),
                ("threads", "threads"),
            )
            if row[name] is not None
        )
        # Text, not str: a key or thread id holds the application's data, brackets too,
        # which rich would read as markup.
        table.add_row(
            Text(
                row["key"] if row["key"] == row["declared"] else f"{row['key']} ({row['declared']})"
            ),
            budget,
            "-" if row["requests_left"] is None else f"{row['requests_left']:.0f}",
            "-" if row["tokens_left"] is None else f"{row['tokens_left']:.0f}",
            str(row["in_flight"]),
            _thread_use(row),
            f"{row['paused_for']:.1f} s" if row["paused_for"] else "",
        )
    console().print(table)
    waiting = Table("key", "position", "thread", "waiting for")
    for row in rows:
        for waiter in row["waiting"]:
            waiting.add_row(
                Text(row["key"]),
                str(waiter["position"]),
                Text(waiter["thread_id"]),
                f"{waiter['waited']:.1f} s",
            )
    if waiting.row_count:
        console().print(waiting)


def _thread_use(row: dict[str, Any]) -> str:
    if row["threads"] is None:
        return "-"
    use = f"{len(row['running_threads'])} running"
    return f"{use}, {len(row['waiting'])} waiting" if row["waiting"] else use


LIMIT_COMMANDS = (limits,)
