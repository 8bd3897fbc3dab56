"""W3C trace context for workers (issue 39): each attempt of a task gets a
span of its own in the task's trace, and every call made during the attempt
sends that span's `traceparent`.

With the OpenTelemetry API installed and a tracer provider configured, the
attempt's span is a real `process <queue>` consumer span (exported by the
application's SDK); without it, the worker still makes the attempt's span
id, hands its `traceparent` to the handler and sends it with its calls.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import secrets
from collections.abc import Iterator
from typing import Any

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")

#: The `traceparent` the client sends with every call made in this context.
current_traceparent: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "muster_traceparent", default=None
)


def parse(tp: str | None) -> tuple[str, str, str] | None:
    """(trace id, span id, flags) of a valid `traceparent`, else None."""
    m = _TRACEPARENT.match((tp or "").strip())
    if not m or m.group(1) == "ff" or set(m.group(2)) == {"0"} or set(m.group(3)) == {"0"}:
        return None
    return m.group(2), m.group(3), m.group(4)


def child(tp: str | None) -> str | None:
    """A new span's `traceparent` in the trace `tp` names (same flags)."""
    p = parse(tp)
    if p is None:
        return None
    span = secrets.token_hex(8)
    while span == "0" * 16:
        span = secrets.token_hex(8)
    return f"00-{p[0]}-{span}-{p[2]}"


@contextlib.contextmanager
def attempt_span(task: Any) -> Iterator[str | None]:
    """The span of one attempt of `task`, open while the block runs: yields
    its `traceparent` (None when the task has no trace context)."""
    tp: str | None = getattr(task, "traceparent", None)
    if tp is None or parse(tp) is None:
        yield None
        return
    try:
        from opentelemetry import trace  # type: ignore[import-not-found]
        from opentelemetry.trace.propagation.tracecontext import (  # type: ignore[import-not-found]
            TraceContextTextMapPropagator,
        )
    except ImportError:
        trace = None
    if trace is not None:
        carrier = {"traceparent": tp}
        if getattr(task, "tracestate", None):
            carrier["tracestate"] = task.tracestate
        parent = TraceContextTextMapPropagator().extract(carrier)
        tracer = trace.get_tracer("muster_client")
        with tracer.start_as_current_span(
            f"process {task.queue}",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": "muster",
                "messaging.operation.type": "process",
                "messaging.destination.name": task.queue,
                "messaging.message.id": task.id,
                "muster.task.attempt": task.attempt,
            },
        ) as span:
            sc = span.get_span_context()
            own = (
                f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}"
                if sc.is_valid
                else None
            )
            # A provider that records nothing keeps the parent's ids: make
            # the attempt's own span id then.
            if own is None or own.split("-")[2] == tp.split("-")[2]:
                own = child(tp)
            with _sending(own):
                yield own
        return
    own = child(tp)
    with _sending(own):
        yield own


@contextlib.contextmanager
def _sending(tp: str | None) -> Iterator[None]:
    """Calls made in the block send `tp`."""
    token = current_traceparent.set(tp)
    try:
        yield
    finally:
        current_traceparent.reset(token)
