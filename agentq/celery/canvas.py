"""The canvas of a thread's first message (``link``, ``link_error``, the rest of a
``chain``, the body of a ``chord``), carried on by the task that ends the thread.

Celery's tracer applies a task's canvas when the task returns or fails in the worker. A
thread's first task often ends without finishing it (waiting for a human, retrying,
handed over), and the task that ends it later is another message, sent without that
canvas: sent with it, Celery would apply it again from every later message. So the canvas
is kept with the thread from the first send (:func:`captured`), in the shape of Celery's
request fields, and the task that ends the thread applies it as the tracer would have for
the first task: its callbacks and the chain's next task get the thread's result, a chord
counts the part under the first task's id, a failure runs the errbacks and fails the
chord, a cancel revokes the first task (its chord counts the part as failed). The store
names the one task that carries it on (``Store.take_canvas``), the first to find the
thread ended, so it runs once; when that is the first task, Celery's own tracer applies
it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Final

from celery import Celery, Task, group
from celery.app.task import Context
from celery.canvas import Signature, maybe_signature
from kombu.serialization import dumps, loads, prepare_accept_content

from agentq.records import ThreadMeta

_REQUEST_FIELDS: Final = {
    "link": "callbacks",
    "link_error": "errbacks",
    "chain": "chain",
    "chord": "chord",
    "group_id": "group",
    "group_index": "group_index",
    "root_id": "root_id",
    "parent_id": "parent_id",
}
"""``apply_async`` options and the request fields a worker reads them into."""

_APPLIED: Final = ("callbacks", "errbacks", "chain", "chord")
"""The fields that make a canvas; the others only place the task in it."""


def captured(options: Mapping[str, Any], serializer: str) -> dict[str, Any] | None:
    """The canvas in ``apply_async`` ``options``, ``None`` if they have none. Encoded as
    the message encodes it, with the task's ``serializer``, so that what the message can
    carry the thread can keep, and signatures come back as the worker reads them."""
    fields = {name: options.get(option) for option, name in _REQUEST_FIELDS.items()}
    if not any(fields[name] for name in _APPLIED):
        return None
    for name in ("callbacks", "errbacks"):  # one signature or several, as Celery takes them
        if isinstance(fields[name], Mapping):
            fields[name] = [fields[name]]
    kept = {name: value for name, value in fields.items() if value is not None}
    content_type, encoding, body = dumps(kept, serializer=serializer)  # type: ignore[no-untyped-call]
    return {"content_type": content_type, "encoding": encoding, "body": body}


def request_of(
    meta: ThreadMeta, accept: Collection[str], running: Context | None = None
) -> Context | None:
    """The request of the thread's first task as far as its canvas goes, decoded if its
    content type is one the worker ``accept``s; ``None`` without a canvas or a first task
    (a fork keeps its source's canvas but has no first task)."""
    if meta.canvas is None or meta.origin is None:
        return None
    stored = meta.canvas
    fields = loads(  # type: ignore[no-untyped-call]
        stored["body"],
        stored["content_type"],
        stored["encoding"],
        accept=prepare_accept_content(accept),  # type: ignore[no-untyped-call]
    )
    return first_request(meta, running, fields)


def first_request(
    meta: ThreadMeta, running: Context | None, fields: Mapping[str, Any] | None = None
) -> Context:
    """The request of the thread's first task (``fields`` its canvas), as the result
    stored under its id describes it with ``result_extended``: its name and arguments as
    the first message had them, the worker and queue those of ``running``, the task that
    ends the thread. Without it the backend would store the result bare, and the first
    task would lose the name and arguments its ``WAITING`` state showed."""
    return Context(
        dict(fields or {}),
        id=meta.origin,
        task=meta.task,
        args=[meta.thread_id],
        kwargs={},
        hostname=running.hostname if running is not None else None,
        delivery_info=(running.delivery_info if running is not None else None) or {},
    )


def succeeded(task: Task, request: Context, result: Any, store_result: bool) -> None:
    """Carry the canvas on with ``result``, as the tracer does for a task that returned:
    the callbacks and the chain's next task first, so the stored result lists them as its
    children, then the result, which counts a chord's part."""
    app = task.app
    linked = {
        "parent_id": request.id,
        "root_id": request.root_id or request.id,
        "add_to_parent": False,  # theirs is the first task, not the one running
    }
    for callback in _callbacks(app, request.callbacks or []):
        request.children.append(callback.apply_async((result,), **linked))
    if request.chain:
        following = maybe_signature(request.chain[-1], app=app)
        request.children.append(
            following.apply_async((result,), chain=request.chain[:-1], **linked)
        )
    task.backend.mark_as_done(request.id, result, request=request, store_result=store_result)


def failed(task: Task, request: Context, exc: BaseException, store_result: bool) -> None:
    """Carry the canvas on with ``exc``, as the tracer does for a task that failed: the
    chain's tasks fail, the chord's part fails and the errbacks run."""
    task.backend.mark_as_failure(request.id, exc, request=request, store_result=store_result)


def _callbacks(app: Celery, callbacks: list[Any]) -> list[Signature]:
    """The callbacks as the tracer applies them: one alone, several as one group beside
    the groups among them (each applied by itself so that its results are not nested)."""
    signatures = [maybe_signature(callback, app=app) for callback in callbacks]
    if len(signatures) < 2:
        return signatures
    groups = [s for s in signatures if isinstance(s, group)]
    others = [s for s in signatures if not isinstance(s, group)]
    return [*groups, group(others, app=app)] if others else groups
