"""OpenTelemetry spans for node runs and tool calls, when ``opentelemetry-api`` is installed.

A thread is one trace, whichever workers ran it. Its trace context is fixed once, when it
is opened: the caller's span if there is one (kept in the thread's send options as the
``traceparent`` header, so every later message carries it: hand-overs, resumes, and the
sweeper's re-sends after a crash, which have no caller), else one derived from the thread
id, which every worker computes alike without asking anyone. Node spans are children of
that context; tool-call spans are children of their node's span, and current while the
call runs.

Without opentelemetry, or with no tracer provider set (spans would record nothing), every
hook returns at once. opentelemetry (and :mod:`agentq.engine.otel`, the spans) is imported
only once something in the process may trace: the application imported it (to set a
tracer provider, or to start the span a thread is sent from), or names a provider in
``OTEL_PYTHON_TRACER_PROVIDER``, which the API loads when first asked. A producer, the
command line and a worker that does not trace pay neither the import nor its hooks.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from agentq.engine.otel import Spans

PROVIDER_VARIABLE: Final = "OTEL_PYTHON_TRACER_PROVIDER"
"""Names the tracer provider opentelemetry's API loads by itself, with no import of the
application's."""

_spans: list[Spans | None] = []
"""Empty until something in the process may trace, then :data:`agentq.engine.otel.SPANS`
if opentelemetry imports, else ``None``. Held, not imported at each hook: an import
statement costs a step a microsecond."""
_provider_named: list[bool] = []
"""Whether the environment names a tracer provider, read at the first hook (once the
application's modules had their say): a read of ``os.environ`` costs a step a microsecond."""


def _loaded() -> Spans | None:
    """The process's spans, loaded once something in the process may trace. Without
    opentelemetry.trace imported nobody set a tracer provider here, nor started a span:
    until one is, or one is named in the environment, no span would record. Looked up at
    every hook until then: one may be set while threads run."""
    if not _spans:
        if not _provider_named:
            _provider_named.append(PROVIDER_VARIABLE in os.environ)
        if "opentelemetry.trace" not in sys.modules and not _provider_named[0]:
            return None
        # Two threads may both get here: the import is made once, and both find the same.
        try:
            from agentq.engine.otel import SPANS
        except ImportError:  # the extra is not installed: tracing is off
            _spans.append(None)
        else:
            _spans.append(SPANS)
    return _spans[0]


def sending_headers() -> dict[str, str]:
    """The caller's trace context as message headers, to keep with a new thread; empty
    when nothing is traced here."""
    spans = _loaded()
    return {} if spans is None else spans.sending_headers()


def node_span(
    thread_id: str, options: Mapping[str, Any], step: int, node: str, attempt: int, token: int
) -> AbstractContextManager[None]:
    """The span of one node run, current for its duration; its outcome is set by
    :func:`outcome` (or ``error`` if the run raised before one was)."""
    spans = _loaded()
    if spans is None or not spans.recording():
        return nullcontext()
    return spans.node_span(thread_id, options, step, node, attempt, token)


def outcome(thread_id: str, what: str) -> None:
    """Name what became of the thread's node run in flight: committed, waiting, retrying..."""
    spans = _loaded()
    if spans is not None:
        spans.outcome(thread_id, what)


def raised(thread_id: str, exc: BaseException) -> None:
    """The thread's node run in flight raised ``exc``, handled without leaving its span
    (a retry was scheduled)."""
    spans = _loaded()
    if spans is not None:
        spans.raised(thread_id, exc)


def tool_span(thread_id: str, step: int, tool: str, token: int) -> AbstractContextManager[Any]:
    """The span of one tool call, a child of its node's span; yields a setter of its
    effect key and (once known) its outcome."""
    spans = _loaded()
    if spans is None or not spans.recording():
        return nullcontext(_ignore)
    return spans.tool_span(thread_id, step, tool, token)


def _ignore(key: str, what: str | None = None) -> None:
    pass
