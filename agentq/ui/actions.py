"""What an operator may do to a thread from its page, each through the same ops functions
and store calls as the command line's ``resume``, ``retry``, ``cancel``, ``fork`` and
``resolve``."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from agentq.errors import InvalidArgument, MessageNotSent, ThreadStateError
from agentq.ids import validate_effect_key, validate_thread_id
from agentq.ops.control import Requeued, cancel, requeue, settle
from agentq.ops.jsonable import loads
from agentq.records import MAX_NUMBER, Status, ThreadMeta
from agentq.store.contract import UNSET, Store
from agentq.store.contract.effects import RESOLVABLE

Form = dict[str, str]
"""A posted form's fields (one value each)."""


@dataclass(frozen=True)
class Outcome:
    """Where the operator goes next: the thread acted on (the fork, for a fork), its
    status after the action, the Celery task id of a message sent at once, if one was,
    and why the app could not send one when it tried (the thread stays queued)."""

    thread_id: str
    status: Status
    sent: str | None = None
    not_sent: MessageNotSent | None = None


@dataclass(frozen=True)
class Action:
    name: str
    title: str
    explains: str
    """What confirming does, on the confirmation page."""
    done: str
    offered: frozenset[Status]
    """The statuses in which the thread's page offers it (the store decides in the end)."""
    guarded: bool = False
    """Refused once the thread has moved on (its fence went up) since the page that asked
    for it was read: a resume must answer the question the operator saw."""

    def offers(self, meta: ThreadMeta) -> bool:
        if self.name == "resume":
            return meta.status in meta.resumable_from
        return meta.status in self.offered


def json_field(form: Form, name: str, what: str) -> Any:
    """A JSON document from the form; ``UNSET`` when left empty."""
    text = form.get(name, "").strip()
    if not text:
        return UNSET
    try:
        return loads(text)
    except ValueError as exc:
        raise InvalidArgument(
            f'{what} is not JSON ({exc}); quote strings, e.g. {{"approved": true}} or "yes"',
            thread_id=form.get("id"),
        ) from exc


def fork_target(form: Form) -> tuple[int, str]:
    thread_id = form.get("id", "")
    step = whole_number(form.get("step", ""), "the step to fork", thread_id)
    target = form.get("to", "").strip() or f"{thread_id}-fork-{step}-{uuid.uuid4().hex[:4]}"
    return step, validate_thread_id(target)


def whole_number(raw: str, what: str, thread_id: str | None = None) -> int:
    # isdecimal alone lets in other scripts' digits, which int() reads but a person
    # typing a step did not mean; leading zeros off and the length first, as int()
    # refuses past 4300 digits.
    digits = raw.lstrip("0") or "0"
    if (
        not (raw.isascii() and raw.isdecimal())
        or len(digits) > len(str(MAX_NUMBER))
        or int(digits) > MAX_NUMBER
    ):
        raise InvalidArgument(
            f"{what} must be a whole number from 0 to {MAX_NUMBER}, got {raw!r}",
            thread_id=thread_id,
        )
    return int(digits)


def _outcome(requeued: Requeued) -> Outcome:
    return Outcome(requeued.thread_id, requeued.status, requeued.sent, requeued.not_sent)


def _resume(store: Store, app: Any, grace: float, form: Form, meta: ThreadMeta) -> Outcome:
    value = json_field(form, "value", "the resume value")
    # As the command line's resume: no value answers nothing (run.interrupt() asks again),
    # and only an answer replaces the one a failed node was given.
    statuses = {Status.WAITING} if value is UNSET else meta.resumable_from
    return _outcome(
        requeue(store, app, form["id"], from_statuses=statuses, value=value, start_grace=grace)
    )


def _retry(store: Store, app: Any, grace: float, form: Form, meta: ThreadMeta) -> Outcome:
    return _outcome(
        requeue(
            store,
            app,
            form["id"],
            from_statuses={Status.FAILED, Status.NEEDS_ATTENTION},
            start_grace=grace,
        )
    )


def _cancel(store: Store, app: Any, grace: float, form: Form, meta: ThreadMeta) -> Outcome:
    cancelled = cancel(store, app, form["id"])
    return Outcome(cancelled.thread_id, cancelled.status)


def _fork(store: Store, app: Any, grace: float, form: Form, meta: ThreadMeta) -> Outcome:
    step, target = fork_target(form)
    forked = store.fork(form["id"], step, target)
    return Outcome(forked.thread_id, forked.status)


def _resolve(store: Store, app: Any, grace: float, form: Form, meta: ThreadMeta) -> Outcome:
    key = validate_effect_key(form.get("key", ""), form["id"])
    if form.get("outcome") == "did_not_run":
        return _outcome(settle(store, app, form["id"], key, did_not_run=True, start_grace=grace))
    if form.get("outcome") != "result":
        raise InvalidArgument(
            "say what the call did: a result, or that it did not run", thread_id=form["id"]
        )
    return _outcome(settle(store, app, form["id"], key, result=_result(form), start_grace=grace))


def _result(form: Form) -> Any:
    result = json_field(form, "result", "the call's result")
    if result is UNSET:
        raise InvalidArgument(
            "give the call's result as JSON (null if the tool returned nothing)",
            thread_id=form.get("id"),
        )
    return result


_SENT: Final = "queued again; "
ACTIONS: Final = {
    action.name: action
    for action in (
        Action(
            "resume",
            "Resume",
            "The thread is queued again; run.interrupt() returns this value in it.",
            "Resumed: " + _SENT,
            frozenset({Status.WAITING, Status.FAILED}),
            guarded=True,
        ),
        Action(
            "retry",
            "Retry",
            "The thread runs again from its latest checkpoint, with its error and attempts "
            "cleared. Fix what failed first.",
            "Retrying: " + _SENT,
            frozenset({Status.FAILED, Status.NEEDS_ATTENTION}),
            guarded=True,
        ),
        Action(
            "cancel",
            "Cancel",
            "An idle thread is cancelled at once; a running one stops at its next step "
            "boundary. A cancelled thread is not run again. Its first Celery task is "
            "marked REVOKED when the inspector has the Celery app (agentq -A module:app "
            "ui); without it, that task keeps its state.",
            "Cancelled.",
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
            guarded=True,
        ),
    )
}

_PERFORMERS: Final[dict[str, Callable[[Store, Any, float, Form, ThreadMeta], Outcome]]] = {
    "resume": _resume,
    "retry": _retry,
    "cancel": _cancel,
    "fork": _fork,
    "resolve": _resolve,
}


def check(action: Action, form: Form, meta: ThreadMeta) -> None:
    """Refuse a form whose values cannot be used, or that was filled in on a page the
    thread has since moved past, before asking to confirm it; fill in what the
    confirmation must show."""
    if action.guarded:
        _unmoved(form, meta)
    if action.name == "resume":
        if json_field(form, "value", "the resume value") is UNSET and meta.status != Status.WAITING:
            # As _resume asks the store: only a waiting thread runs on without an answer.
            raise ThreadStateError(
                f"the thread is {meta.status.value}, and holds the answer its failed node was "
                "given: give the answer it takes now, or retry it to give it the same one again",
                thread_id=meta.thread_id,
                status=meta.status.value,
            )
    elif action.name == "fork":
        # Named now, so the confirmation shows the new thread's id and confirming makes it.
        form["to"] = fork_target(form)[1]
    elif action.name == "resolve" and form.get("outcome") == "result":
        _result(form)


def _unmoved(form: Form, meta: ThreadMeta) -> None:
    # The fence goes up whenever a worker takes the thread or a person reopens it, so an
    # unchanged fence means the page showed the question and error that are still there.
    if form.get("fence") != str(meta.fence):
        raise ThreadStateError(
            f"the thread has moved on since its page was read (fencing token "
            f"{form.get('fence') or 'missing'}, now {meta.fence}; status "
            f"{meta.status.value}, step {meta.step}): reload its page, check what it "
            "waits for now, and act again",
            thread_id=meta.thread_id,
            status=meta.status.value,
        )


def perform(
    store: Store, app: Any, start_grace: float, action: Action, form: Form, meta: ThreadMeta
) -> Outcome:
    """Do ``action`` on the thread whose meta was read for this request: checked again
    first, as the thread may have moved on while its confirmation was open."""
    check(action, form, meta)
    return _PERFORMERS[action.name](store, app, start_grace, form, meta)


def notice(action: Action, status: Status | None) -> str:
    """What the thread's page says after ``action`` left the thread in ``status``."""
    if action.name == "cancel" and status is not None and status != Status.CANCELLED:
        if status.finished:
            return f"Nothing to cancel: the thread had already {_ENDED[status]}."
        return "Cancel requested: the thread stops at its next step boundary."
    return action.done


_ENDED: Final = {Status.DONE: "finished", Status.FAILED: "failed"}
