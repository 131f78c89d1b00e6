"""Commands that change a thread: fork, resume, retry, cancel."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from typing import Any

import click
from rich.markup import escape

from agentq.cli.output import emit_json
from agentq.cli.read_commands import STEP, json_option, pass_session
from agentq.cli.session import Session
from agentq.ids import validate_thread_id
from agentq.ops.console import console
from agentq.ops.control import Requeued, requeue
from agentq.ops.control import cancel as cancel_thread
from agentq.ops.jsonable import loads, plain, short
from agentq.records import Status
from agentq.store.contract import UNSET


def parse_json(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """A JSON document given on the command line (``None`` when the option is absent)."""
    if value is None:
        return None
    try:
        return loads(value)
    except ValueError as exc:
        raise click.BadParameter(
            f"{value!r} is not JSON ({exc}); quote strings, e.g. '{{\"approved\": true}}' "
            "or '\"yes\"'",
            ctx,
            param,
        ) from exc


@click.command(short_help="Copy a checkpoint into a new thread.")
@click.argument("thread")
@click.option(
    "--from",
    "step",
    type=STEP,
    required=True,
    help="The checkpoint (step) to copy.",
)
@click.option("--to", "new_thread", help="The new thread's id (default: THREAD-fork-N-xxxx).")
@json_option
@pass_session
def fork(session: Session, thread: str, step: int, new_thread: str | None, as_json: bool) -> None:
    """Copy checkpoint N of THREAD into a new thread, to replay or try something else from
    there. The fork waits: start it with 'agentq resume NEW', adding --value JSON when
    its first node asks a human (run.interrupt() returns that value)."""
    source = session.meta(thread)
    # Only an absent --to gets a generated id: --to "" is a mistake (an unset variable).
    if new_thread is None:
        new_thread = f"{thread}-fork-{step}-{uuid.uuid4().hex[:4]}"
    target = validate_thread_id(new_thread)
    meta = session.store.fork(thread, step, target)
    if as_json:
        emit_json(meta)
        return
    start = f"agentq resume {escape(target)}"
    if source.status == Status.WAITING and source.step == step and source.interrupt is not None:
        # The source waits on a question its next node asked: the fork asks it again.
        hint = (
            f"{start} --value JSON, the answer to {escape(short(source.interrupt, 60))} "
            "(without --value it waits on that question again)"
        )
    else:
        hint = (
            f"{start} (if node {escape(meta.node or '-')} asks a human, it waits again "
            f"for: {start} --value JSON)"
        )
    console().print(
        f"Forked [bold]{escape(thread)}[/] at step {step} into "
        f"[bold cyan]{escape(target)}[/] ({meta.status.value}). Start it with: {hint}"
    )


def _reopen_and_send(
    session: Session, thread: str, from_statuses: Collection[Status], value: Any = UNSET
) -> Requeued:
    """Queue the thread again and tell how it will start: sent now with an app, else
    picked up by the workers' sweeper (which re-sends every due thread)."""
    session.meta(thread)
    app = session.app
    return requeue(
        session.store,
        app,
        thread,
        from_statuses=from_statuses,
        value=value,
        start_grace=session.settings.start_grace,
    )


def queued_outcome(requeued: Requeued, **fields: Any) -> dict[str, Any]:
    """What ``--json`` prints of a thread queued again."""
    not_sent = None if requeued.not_sent is None else str(requeued.not_sent)
    return {
        "thread_id": requeued.thread_id,
        **fields,
        "status": requeued.status.value,
        "sent": requeued.sent,
        "not_sent": not_sent,
    }


def report_queued(requeued: Requeued, outcome: dict[str, Any], verb: str, as_json: bool) -> None:
    """Tell how the thread will start. A message the app could not send fails the command
    as Celery's ``delay()`` fails on a broker it cannot reach, with the error saying the
    thread is queued all the same, so that nobody asks again (which is refused)."""
    if as_json:
        emit_json(outcome)
    if requeued.not_sent is not None:
        raise requeued.not_sent
    if as_json:
        return
    thread = escape(outcome["thread_id"])
    if outcome["sent"]:
        console().print(
            f"{verb} [bold cyan]{thread}[/]: queued, message sent "
            f"(Celery task id {outcome['sent']})."
        )
    else:
        console().print(
            f"{verb} [bold cyan]{thread}[/]: queued; a worker's sweeper starts it "
            "within one sweep interval (pass -A module:app to send it at once)."
        )


@click.command(short_help="Continue a waiting thread (answer its interrupt).")
@click.argument("thread")
@click.option(
    "--value",
    metavar="JSON",
    callback=parse_json,
    help="What run.interrupt() returns in the thread, as JSON. Without it the thread "
    "runs on and a run.interrupt() waits again.",
)
@json_option
@pass_session
def resume(session: Session, thread: str, value: Any, as_json: bool) -> None:
    """Continue a waiting THREAD (interrupted for a human, or a fresh fork). A thread that
    failed in the node given the previous answer takes a new one with --value."""
    # --value null answers None; no --value at all answers nothing.
    source = click.get_current_context().get_parameter_source("value")
    given = source == click.core.ParameterSource.COMMANDLINE
    answer = value if given else UNSET
    statuses = session.meta(thread).resumable_from if given else {Status.WAITING}
    requeued = _reopen_and_send(session, thread, statuses, answer)
    outcome = queued_outcome(requeued, resume_value=plain(value) if given else None)
    report_queued(requeued, outcome, "Resumed", as_json)


@click.command(short_help="Run a failed thread again from its latest checkpoint.")
@click.argument("thread")
@json_option
@pass_session
def retry(session: Session, thread: str, as_json: bool) -> None:
    """Run a failed or needs_attention THREAD again from its latest checkpoint, once you
    fixed what stopped it."""
    requeued = _reopen_and_send(session, thread, {Status.FAILED, Status.NEEDS_ATTENTION})
    report_queued(requeued, queued_outcome(requeued), "Retrying", as_json)


@click.command(short_help="Cancel a thread.")
@click.argument("thread")
@json_option
@pass_session
def cancel(session: Session, thread: str, as_json: bool) -> None:
    """Cancel THREAD: at once if idle, at its next step boundary if running. With -A
    module:app it is cancelled as agent.cancel() does: its first Celery task is marked
    REVOKED, so get() on it stops waiting. Without an app only the store is changed (a
    concurrency slot held for it goes to the next thread at the next sweep), and that
    task keeps its state (WAITING, say)."""
    meta = session.meta(thread)
    before = meta.status
    done = cancel_thread(session.store, session.app, thread)
    if as_json:
        emit_json(
            {
                "thread_id": thread,
                "status": done.status.value,
                "was": before.value,
                "task_revoked": done.task_revoked,
            }
        )
        return
    if done.status == Status.RUNNING:
        message = "cancel requested; its worker stops it at the next step boundary."
    elif done.status == Status.CANCELLED and before != Status.CANCELLED:
        message = "cancelled" + (
            "; its first Celery task is REVOKED."
            if done.task_revoked
            else f". Its first Celery task keeps its state: {_unrevoked(session, meta.task)}."
        )
    else:
        message = f"already {done.status.value}; nothing to cancel."
    console().print(f"[bold cyan]{escape(thread)}[/]: {message}")


def _unrevoked(session: Session, task: str) -> str:
    """Why a cancel left the thread's first task as it was."""
    if session.app is None:
        return "pass -A module:app to mark it REVOKED too"
    return f"the app has no agent task {escape(task)!r} to mark it REVOKED with"


CONTROL_COMMANDS: tuple[Any, ...] = (fork, resume, retry, cancel)
