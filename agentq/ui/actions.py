"""What an operator may do to a thread from its page, each through the same ops functions
and store calls as the command line's ``resume``, ``retry``, ``cancel``, ``fork`` and
``resolve``."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from agentq.errors import InvalidArgument
from agentq.ids import validate_effect_key, validate_thread_id
from agentq.ops.control import Requeued, cancel, requeue, settle
from agentq.records import Status
from agentq.store.contract import Store
from agentq.store.contract.effects import RESOLVABLE

Form = dict[str, str]
"""A posted form's fields (one value each)."""


@dataclass(frozen=True)
class Outcome:
    """Where the operator goes next: the thread acted on (the fork, for a fork) and the
    Celery task id of a message sent at once, if one was."""

    thread_id: str
    sent: str | None = None


@dataclass(frozen=True)
class Action:
    name: str
    title: str
    explains: str
    """What confirming does, on the confirmation page."""
    done: str
    offered: frozenset[Status]
    """The statuses in which the thread's page offers it (the store decides in the end)."""


def json_field(form: Form, name: str, what: str) -> Any:
    """A JSON document from the form; ``None`` when left empty."""
    text = form.get(name, "").strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(
            f'{what} is not JSON ({exc}); quote strings, e.g. {{"approved": true}} or "yes"',
            thread_id=form.get("id"),
        ) from exc


def fork_target(form: Form) -> tuple[int, str]:
    thread_id = form.get("id", "")
    raw = form.get("step", "")
    if not raw.isdigit():
        raise InvalidArgument(
            f"the step to fork must be a whole number, got {raw!r}", thread_id=thread_id
        )
    step = int(raw)
    target = form.get("to", "").strip() or f"{thread_id}-fork-{step}-{uuid.uuid4().hex[:4]}"
    return step, validate_thread_id(target)


def _outcome(requeued: Requeued) -> Outcome:
    return Outcome(requeued.thread_id, requeued.sent)


def _resume(store: Store, app: Any, grace: float, form: Form) -> Outcome:
    value = json_field(form, "value", "the resume value")
    return _outcome(
        requeue(
            store, app, form["id"], from_statuses={Status.WAITING}, value=value, start_grace=grace
        )
    )


def _retry(store: Store, app: Any, grace: float, form: Form) -> Outcome:
    return _outcome(
        requeue(
            store,
            app,
            form["id"],
            from_statuses={Status.FAILED, Status.NEEDS_ATTENTION},
            start_grace=grace,
        )
    )


def _cancel(store: Store, app: Any, grace: float, form: Form) -> Outcome:
    return Outcome(cancel(store, app, form["id"]).thread_id)


def _fork(store: Store, app: Any, grace: float, form: Form) -> Outcome:
    step, target = fork_target(form)
    return Outcome(store.fork(form["id"], step, target).thread_id)


def _resolve(store: Store, app: Any, grace: float, form: Form) -> Outcome:
    key = validate_effect_key(form.get("key", ""), form["id"])
    if form.get("outcome") == "did_not_run":
        return _outcome(settle(store, app, form["id"], key, did_not_run=True, start_grace=grace))
    if form.get("outcome") != "result":
        raise InvalidArgument(
            "say what the call did: a result, or that it did not run", thread_id=form["id"]
        )
    result = json_field(form, "result", "the call's result")
    return _outcome(settle(store, app, form["id"], key, result=result, start_grace=grace))


_SENT: Final = "queued again; "
ACTIONS: Final = {
    action.name: action
    for action in (
        Action(
            "resume",
            "Resume",
            "The thread is queued again; run.interrupt() returns this value in it.",
            "Resumed: " + _SENT,
            frozenset({Status.WAITING}),
        ),
        Action(
            "retry",
            "Retry",
            "The thread runs again from its latest checkpoint, with its error and attempts "
            "cleared. Fix what failed first.",
            "Retrying: " + _SENT,
            frozenset({Status.FAILED, Status.NEEDS_ATTENTION}),
        ),
        Action(
            "cancel",
            "Cancel",
            "An idle thread is cancelled at once; a running one stops at its next step "
            "boundary. A cancelled thread is not run again. Its first Celery task is "
            "marked REVOKED when the inspector has the Celery app (agentq -A module:app "
            "ui); without it, that task keeps its state.",
            "Cancel requested: an idle thread is cancelled, a running one stops at its "
            "next step boundary.",
            frozenset(Status) - {Status.DONE, Status.FAILED, Status.CANCELLED},
        ),
        Action(
            "fork",
            "Fork",
            "A new thread is made from this checkpoint, waiting: resume it to run it.",
            "Forked: this is the new thread, waiting; resume it to run it.",
            frozenset(Status),
        ),
        Action(
            "resolve",
            "Settle",
            "The tool call's record is settled as you checked it: done with this result (the "
            "node gets it back, the tool is not called), or removed (the tool runs, once). "
            "The thread is then queued again.",
            "Settled: " + _SENT,
            RESOLVABLE,
        ),
    )
}

_PERFORMERS: Final[dict[str, Callable[[Store, Any, float, Form], Outcome]]] = {
    "resume": _resume,
    "retry": _retry,
    "cancel": _cancel,
    "fork": _fork,
    "resolve": _resolve,
}


def check(action: Action, form: Form) -> None:
    """Refuse a form whose values cannot be used, before asking to confirm it; fill in
    what the confirmation must show."""
    if action.name == "resume":
        json_field(form, "value", "the resume value")
    elif action.name == "fork":
        # Named now, so the confirmation shows the new thread's id and confirming makes it.
        form["to"] = fork_target(form)[1]
    elif action.name == "resolve" and form.get("outcome") == "result":
        json_field(form, "result", "the call's result")


def perform(store: Store, app: Any, start_grace: float, action: Action, form: Form) -> Outcome:
    return _PERFORMERS[action.name](store, app, start_grace, form)
