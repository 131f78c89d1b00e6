"""agentq's spans in OpenTelemetry: imported by :mod:`agentq.engine.tracing` once something
in the process may trace, so that importing agentq does not load opentelemetry."""

from __future__ import annotations

import contextvars
import hashlib
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACEPARENT: Final = "traceparent"

_own: contextvars.ContextVar[tuple[str, Any] | None] = contextvars.ContextVar(
    "agentq_node_span", default=None
)
"""The thread id and node span of the drive running here (its tool calls on the event loop
see it too): its own, whichever other drive of the thread this process runs."""


def _thread_context(thread_id: str, options: Mapping[str, Any]) -> Any:
    headers = options.get("headers")
    if isinstance(headers, Mapping) and headers.get(TRACEPARENT):
        return TraceContextTextMapPropagator().extract(dict(headers))
    digest = hashlib.sha256(thread_id.encode()).digest()
    trace_id = int.from_bytes(digest[:16], "big")
    parent = trace.SpanContext(
        trace_id=trace_id,
        span_id=int.from_bytes(digest[16:24], "big") or 1,
        is_remote=True,
        trace_flags=trace.TraceFlags(
            trace.TraceFlags.SAMPLED if _sampled(trace_id) else trace.TraceFlags.DEFAULT
        ),
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(parent))


def _sampled(trace_id: int) -> bool:
    """Whether the tracer provider's sampler keeps a trace that starts at the thread. The
    parent made up for it is no caller's to have decided, and a sampled one would make a
    parent-based sampler keep every such thread, whatever ratio it was given for roots.
    Asked as for a root with the thread's trace id, which a ratio sampler decides by
    alone: alike on every worker, at every step."""
    sampler = getattr(trace.get_tracer_provider(), "sampler", None)
    if sampler is None:  # not the SDK's provider: no sampler to ask
        return True
    # An empty context: a root, not a child of whatever span is current here.
    result = sampler.should_sample(otel_context.Context(), trace_id, "agentq.thread")
    return bool(result.decision.is_sampled())


def _failed(span: Any, exc: BaseException) -> None:
    # The status, not only the event: what tracing backends mark and search as failed.
    span.record_exception(exc)
    span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


class Spans:
    """The spans of this process's node runs and tool calls."""

    def __init__(self) -> None:
        self._nodes: dict[str, Any] = {}
        """The open node span of each thread this process runs, for tool calls made from
        threads of the node's own (the latest one's: a drive that lost its lease may still
        run its node beside the drive that took the thread over)."""
        self._nodes_lock = threading.Lock()

    def sending_headers(self) -> dict[str, str]:
        """The caller's trace context as message headers, to keep with a new thread; empty
        when nothing is traced here."""
        if not trace.get_current_span().get_span_context().is_valid:
            return {}
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
        return carrier

    def recording(self) -> bool:
        """Whether a span would record anything: a tracer provider other than the API's
        placeholders is set (checked every time: one may be set while threads run)."""
        return not isinstance(
            trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
        )

    @contextmanager
    def node_span(
        self,
        thread_id: str,
        options: Mapping[str, Any],
        step: int,
        node: str,
        attempt: int,
        token: int,
    ) -> Iterator[None]:
        """The span of one node run, current for its duration; its outcome is set by
        :func:`outcome` (or ``error`` if the run raised before one was)."""
        span = trace.get_tracer("agentq").start_span(
            f"agentq.node {node}",
            context=_thread_context(thread_id, options),
            attributes={
                "agentq.thread_id": thread_id,
                "agentq.step": step,
                "agentq.node": node,
                "agentq.attempt": attempt,
                "agentq.fencing_token": token,
            },
        )
        with self._nodes_lock:
            self._nodes[thread_id] = span
        own = _own.set((thread_id, span))
        attached = otel_context.attach(trace.set_span_in_context(span))
        try:
            yield
        except BaseException as exc:
            _failed(span, exc)
            if "agentq.outcome" not in (getattr(span, "attributes", None) or {}):
                span.set_attribute("agentq.outcome", "error")
            raise
        finally:
            otel_context.detach(attached)
            _own.reset(own)
            with self._nodes_lock:
                # Not if it is the span of a drive that took over since.
                if self._nodes.get(thread_id) is span:
                    del self._nodes[thread_id]
            span.end()

    def _node_of(self, thread_id: str) -> Any:
        """The node span a hook for ``thread_id`` belongs to: the drive's own, else (a tool
        called from a thread the node started) the latest open one of the thread."""
        own = _own.get()
        if own is not None and own[0] == thread_id:
            return own[1]
        if not self._nodes:  # nothing traced here: no lock taken on every commit
            return None
        with self._nodes_lock:
            return self._nodes.get(thread_id)

    def outcome(self, thread_id: str, what: str) -> None:
        """Name what became of the thread's node run in flight: committed, waiting,
        retrying..."""
        span = self._node_of(thread_id)
        if span is not None:
            span.set_attribute("agentq.outcome", what)

    def raised(self, thread_id: str, exc: BaseException) -> None:
        """The thread's node run in flight raised ``exc``, handled without leaving its span
        (a retry was scheduled)."""
        span = self._node_of(thread_id)
        if span is not None:
            _failed(span, exc)

    @contextmanager
    def tool_span(
        self, thread_id: str, step: int, tool: str, token: int
    ) -> Iterator[Callable[..., None]]:
        """The span of one tool call, a child of its node's span; yields a setter of its
        effect key and (once known) its outcome."""
        node = self._node_of(thread_id)
        # Set explicitly: an async node's tools run in the event loop's thread, where the
        # node span is not the current one.
        parent = trace.set_span_in_context(node) if node is not None else None
        span = trace.get_tracer("agentq").start_span(
            f"agentq.tool {tool}",
            context=parent,
            attributes={
                "agentq.thread_id": thread_id,
                "agentq.step": step,
                "agentq.tool": tool,
                "agentq.fencing_token": token,
            },
        )

        def note(key: str, what: str | None = None) -> None:
            span.set_attribute("agentq.effect_key", key)
            if what is not None:
                span.set_attribute("agentq.outcome", what)

        # Current while the call runs: the spans the tool starts (an instrumented HTTP
        # client's) are its children, not its siblings under the node.
        attached = otel_context.attach(trace.set_span_in_context(span))
        try:
            yield note
        except BaseException as exc:
            _failed(span, exc)
            span.set_attribute("agentq.outcome", "error")
            raise
        finally:
            otel_context.detach(attached)
            span.end()


SPANS: Final = Spans()
