"""What a node's return value makes of its thread: the checkpoint and status to commit."""

from __future__ import annotations

import dataclasses
import inspect
import time
import traceback
from typing import Any

from agentq.codec import check_shape
from agentq.engine.run import Run
from agentq.errors import CheckpointLost, UnknownNode
from agentq.outcomes import Done, Interrupt, wait_seconds
from agentq.records import Checkpoint, Status, ThreadMeta
from agentq.store.contract import UNSET


def checkpoint_after(
    run: Run, outcome: Any, *, task: str, token: int
) -> tuple[Checkpoint, Status, dict[str, Any]]:
    """The checkpoint of ``run``'s step, the thread's status after it, and what to commit
    with it: ``due_in`` (a running thread's follows its lease, a wait's is its timeout)
    and the ``result`` or ``interrupt``; :class:`~agentq.errors.UnknownNode` for a return
    value that names no next step, :class:`~agentq.errors.InvalidArgument` for a bad
    timeout, :class:`~agentq.errors.UnserializableState` for a state, pending list or
    cursors replaced by another type."""
    extra: dict[str, Any] = {"due_in": None}
    if isinstance(outcome, Done):
        next_node, status, extra["result"] = None, Status.DONE, outcome.result
    elif isinstance(outcome, Interrupt):
        if not isinstance(outcome.resume_at, str):
            # Stored, the thread would wait for a resume that finds no node to go on at.
            raise UnknownNode(
                f"node {run.node!r} returned an Interrupt whose resume_at is "
                f"{type(outcome.resume_at).__name__}, not a node's name; name the node the "
                "answer continues at: Interrupt(payload, resume_at='node')",
                thread_id=run.thread_id,
                step=run.step,
            )
        next_node, status, extra["interrupt"] = outcome.resume_at, Status.WAITING, outcome.payload
        extra["due_in"] = wait_seconds(outcome.timeout, thread_id=run.thread_id, step=run.step)
    elif isinstance(outcome, str):
        next_node, status, extra["due_in"] = outcome, Status.RUNNING, UNSET
    elif inspect.isawaitable(outcome):
        if inspect.iscoroutine(outcome):
            outcome.close()  # else Python warns, far from here, that it was never awaited
        raise UnknownNode(
            f"node {run.node!r} returned a {type(outcome).__name__} it did not await; "
            "await it (return await ...) to return what it gives",
            thread_id=run.thread_id,
            step=run.step,
        )
    else:
        raise UnknownNode(
            f"node {run.node!r} returned {type(outcome).__name__}; return the next node's "
            "name, Done(result) or Interrupt(payload, resume_at=...)",
            thread_id=run.thread_id,
            step=run.step,
        )
    if isinstance(next_node, str):
        # A name given as a str subclass (an enum member) as the plain str it holds: the
        # codec refuses subclasses, and str() of a (str, Enum) member is not its value.
        next_node = str.__str__(next_node)
    if run.pending is None:
        # A chat client's reply without a tool call holds ``tool_calls: None``, which a
        # node keeps as it is (``run.pending = reply["tool_calls"]``): no call is pending.
        run.pending = []
    checkpoint = Checkpoint(
        step=run.step,
        node=next_node,
        state=run.state,
        pending=run.pending,
        cursors=run.cursors,
        task=task,
        token=token,
        created_at=time.time(),
    )
    # Before the append-only check, which reads the state as a dict.
    check_shape(run.thread_id, checkpoint)
    return checkpoint, status, extra


def meta_after(
    meta: ThreadMeta, checkpoint: Checkpoint, status: Status, extra: dict[str, Any], *, cancel: bool
) -> ThreadMeta:
    """The thread's meta as the commit of ``checkpoint`` with ``status`` and ``extra`` left
    it (``meta`` being what it was before), so the task need not read it back."""
    return dataclasses.replace(
        meta,
        status=status,
        step=checkpoint.step,
        node=checkpoint.node,
        attempts=0,
        crashes=0,
        error=None,
        updated_at=checkpoint.created_at,
        result=extra.get("result", meta.result),
        interrupt=extra.get("interrupt"),
        resume_value=None,
        resumed=False,
        cancel_requested=cancel,
    )


def error_text(exc: BaseException, limit: int = 2000) -> str:
    """What a failed or retrying thread keeps of the error: its type, message and the
    end of its traceback."""
    trace = "".join(traceback.format_exception(exc, limit=-3))
    return f"{type(exc).__name__}: {exc}\n{trace}"[:limit]


def checkpoint_lost(thread_id: str, step: int, what: str) -> CheckpointLost:
    """The error of a thread whose committed step ``step`` the store no longer holds."""
    return CheckpointLost(
        f"data loss: step {step} was committed but {what}; the store dropped "
        "acknowledged writes (eviction, no persistence, an old backup: run agentq "
        f"doctor). Fork it from an older checkpoint if one is left ('agentq fork {thread_id} "
        "--from N', store.fork in code), or delete it (store.delete_thread)",
        thread_id=thread_id,
        step=step,
    )
