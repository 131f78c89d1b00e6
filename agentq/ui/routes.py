"""The pages and the actions. Store calls block, so every handler that makes them is a
plain function, which Starlette runs on its thread pool."""

from __future__ import annotations

import hashlib
import hmac
import logging
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from agentq.engine import metrics
from agentq.errors import (
    AgentqError,
    ArtifactNotFound,
    CheckpointNotFound,
    ConfigError,
    InvalidArgument,
    ThreadNotFound,
)
from agentq.ids import validate_thread_id
from agentq.ops.jsonable import dumps
from agentq.records import Checkpoint, Status, ThreadMeta
from agentq.ui.actions import ACTIONS, Form, check, notice, perform, whole_number
from agentq.ui.inspector import Inspector
from agentq.ui.security import SECURE_HEADERS, same
from agentq.ui.views import Filter, Shown, as_json, diff, summary, thread_view, threads_page

logger = logging.getLogger("agentq")

_MAX_FORM: Final = 1 << 20


def inspector(request: Request) -> Inspector:
    found: Inspector = request.app.state.inspector
    return found


def render(request: Request, name: str, status_code: int = 200, **context: Any) -> Response:
    ins = inspector(request)
    context.setdefault("read_only", ins.read_only)
    context.setdefault("csrf", ins.csrf)
    return ins.templates.TemplateResponse(request, name, context, status_code=status_code)


def _number(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    return whole_number(raw, name)


def _filter(request: Request) -> Filter:
    raw = request.query_params.get("status") or None
    if raw is not None and raw not in {status.value for status in Status}:
        raise InvalidArgument(f"status {raw!r} is not one of {', '.join(s.value for s in Status)}")
    return Filter(
        Status(raw) if raw else None,
        request.query_params.get("task", "").strip(),
        # Not stripped: a thread id may start with a space.
        request.query_params.get("prefix", ""),
    )


def _query(wanted: Filter, **extra: Any) -> str:
    pairs = {"status": wanted.status.value if wanted.status else "", "task": wanted.task}
    pairs.update(prefix=wanted.prefix, **{k: v for k, v in extra.items() if v is not None})
    return urlencode({k: v for k, v in pairs.items() if v != ""})


def home(request: Request) -> Response:
    return RedirectResponse("/threads", status_code=303)


def threads(request: Request) -> Response:
    wanted = _filter(request)
    page = threads_page(inspector(request).store, wanted, request.query_params.get("after") or None)
    live = request.url.path.endswith("/live")
    return render(
        request,
        "threads_live.html" if live else "threads.html",
        page=page,
        wanted=wanted,
        query=_query(wanted),
        live_query=_query(wanted, after=page.after),
        next_query=None if page.next_after is None else _query(wanted, after=page.next_after),
        first_query=_query(wanted) if page.after else None,
    )


def _meta(request: Request) -> ThreadMeta:
    thread_id = validate_thread_id(request.query_params.get("id", ""))
    meta = inspector(request).store.meta(thread_id)
    if meta is None:
        raise ThreadNotFound("no such thread in this store", thread_id=thread_id)
    return meta


def thread(request: Request) -> Response:
    store = inspector(request).store
    meta = _meta(request)
    if request.url.path.endswith("/live"):
        # Refreshed every few seconds by every open page: the meta and lease, nothing more.
        return render(request, "thread_live.html", view=summary(store, meta))
    view = thread_view(store, meta, _number(request, "step"))
    a, b = _number(request, "a"), _number(request, "b")
    changes = diff(store, meta.thread_id, a, b) if a is not None and b is not None else None
    if a is None and len(view.timeline) > 1:
        a, b = view.timeline[1].checkpoint.step, view.timeline[0].checkpoint.step
    told = _told(request, meta.thread_id)
    done = told.get("done", "")
    return render(
        request,
        "thread.html",
        view=view,
        a=a,
        b=b,
        changes=changes,
        parts=_parts(view.shown) if view.shown is not None else [],
        notice=notice(ACTIONS[done], _status(told)) if done in ACTIONS else None,
        sent=told.get("sent"),
        not_sent=told.get("not_sent") == "1",
        start_grace=inspector(request).start_grace,
        actions=ACTIONS,
    )


_TOLD: Final = ("done", "status", "sent", "not_sent")
"""What an action's redirect tells the thread's page, signed by :func:`_signature`."""


def _signature(request: Request, thread_id: str, told: dict[str, str]) -> str:
    text = "\0".join([thread_id, *(told.get(name, "") for name in _TOLD)])
    secret = inspector(request).csrf.encode()
    return hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()[:32]


def _told(request: Request, thread_id: str) -> dict[str, str]:
    """The action's outcome from the address, if this inspector wrote it: a link anyone can
    make must not have the page say a thread was cancelled or a message sent."""
    told = {name: request.query_params[name] for name in _TOLD if name in request.query_params}
    if not same(request.query_params.get("sig"), _signature(request, thread_id, told)):
        return {}
    return told


def _status(told: dict[str, str]) -> Status | None:
    raw = told.get("status", "")
    return next((status for status in Status if status.value == raw), None)


def _parts(checkpoint: Checkpoint) -> list[tuple[str, Shown]]:
    calls = len(checkpoint.pending)
    return [
        ("state", as_json(checkpoint.state)),
        (f"pending ({calls} tool call{'' if calls == 1 else 's'})", as_json(checkpoint.pending)),
        ("cursors", as_json(checkpoint.cursors)),
    ]


def checkpoint_json(request: Request) -> Response:
    meta = _meta(request)
    step = _number(request, "step")
    store = inspector(request).store
    found = meta if step is None else store.checkpoint(meta.thread_id, step)
    # As the command line's --json: strict JSON, a NaN in a state tagged as bytes are.
    return Response(dumps(found), media_type="application/json")


def artifact(request: Request) -> Response:
    meta = _meta(request)
    digest = request.query_params.get("digest", "")
    data = inspector(request).store.get_artifact(meta.thread_id, digest)
    # Never shown inline: an artifact is whatever the agent stored, a page included.
    return Response(
        data,
        media_type="application/octet-stream",
        headers={"content-disposition": f'attachment; filename="{digest[:16]}.bin"'},
    )


def scrape(request: Request) -> Response:
    """Prometheus metrics of the store: threads by status, needs_attention, due lag."""
    try:
        collected = metrics.registry(inspector(request).store, counters=False)
    except ConfigError as exc:
        return Response(str(exc), status_code=404, media_type="text/plain")
    body, content_type = metrics.exposition(collected)
    return Response(body, media_type=content_type)


async def action(request: Request) -> Response:
    ins = inspector(request)
    if ins.read_only:
        return render(request, "error.html", 403, message="this inspector is read-only")
    body = await _form_body(request)
    if body is None:
        return render(request, "error.html", 413, message="the form is too large")
    form: Form = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
    if not same(form.get("csrf"), ins.csrf):
        return render(
            request,
            "error.html",
            403,
            message="the form is stale or from another site (CSRF check); reload the "
            "thread's page and try again",
        )
    return await run_in_threadpool(_act, request, form)


async def _form_body(request: Request) -> bytes | None:
    """The posted body, or ``None`` past :data:`_MAX_FORM`: read no further than that, as
    any page the operator has open can post to a loopback inspector."""
    declared = request.headers.get("content-length", "")
    if declared.isdecimal() and int(declared) > _MAX_FORM:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > _MAX_FORM:
            return None
    return bytes(body)


def _act(request: Request, form: Form) -> Response:
    ins = inspector(request)
    name = form.get("action", "")
    if name not in ACTIONS:
        raise InvalidArgument(f"unknown action {name!r}")
    thread_id = validate_thread_id(form.get("id", ""))
    meta = ins.store.meta(thread_id)
    if meta is None:
        raise ThreadNotFound("no such thread in this store", thread_id=thread_id)
    spec = ACTIONS[name]
    try:
        if form.get("confirmed") != "yes":
            check(spec, form, meta)  # a bad value is told before the confirmation, not after
            return render(request, "confirm.html", spec=spec, form=form, meta=meta, error=None)
        outcome = perform(ins.store, ins.app, ins.start_grace, spec, form, meta)
    except AgentqError as exc:
        return render(request, "confirm.html", 409, spec=spec, form=form, meta=meta, error=str(exc))
    told = {"done": name, "status": outcome.status.value}
    if outcome.sent:
        told["sent"] = outcome.sent
    if outcome.not_sent is not None:
        # Only a flag in the address: the broker's words go to the log.
        logger.warning("inspector: %s", outcome.not_sent)
        told["not_sent"] = "1"
    query = {"id": outcome.thread_id, **told, "sig": _signature(request, outcome.thread_id, told)}
    return RedirectResponse("/thread?" + urlencode(query), status_code=303)


async def not_found(request: Request, exc: Exception) -> Response:
    return render(request, "error.html", 404, message=str(exc))


async def bad_request(request: Request, exc: Exception) -> Response:
    return render(request, "error.html", 400, message=str(exc))


async def server_error(request: Request, exc: Exception) -> Response:
    if inspector(request).store.is_transient(exc):
        message = f"the store did not answer ({type(exc).__name__}: {exc}); reload to try again"
        response = render(request, "error.html", 503, message=message)
    else:
        message = f"internal error: {type(exc).__name__}: {exc}"
        response = render(request, "error.html", 500, message=message)
    # Starlette sends this from outside every middleware, SecureHeaders included.
    response.raw_headers.extend(SECURE_HEADERS)
    return response


ROUTES: Final = [
    Route("/", home),
    Route("/threads", threads),
    Route("/threads/live", threads),
    Route("/thread", thread),
    Route("/thread/live", thread),
    Route("/thread/json", checkpoint_json),
    Route("/thread/artifact", artifact),
    Route("/thread/action", action, methods=["POST"]),
    Route("/metrics", scrape),
]
EXCEPTION_HANDLERS: Final = {
    ThreadNotFound: not_found,
    CheckpointNotFound: not_found,
    ArtifactNotFound: not_found,
    AgentqError: bad_request,
    Exception: server_error,
}
