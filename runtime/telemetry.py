"""Run logs and OpenTelemetry spans (docs/operations.md).

**Logs.** `log_run_change` is a change-hub listener (`runtime.frames.ChangeHub.add_listener`)
the runtime installs: it writes one line per run transition on the ``runtime.runs`` logger,
at INFO, with the fields ``thread_id``, ``run_id``, ``effect``, ``status``, ``change``,
``attempt``, ``lag_seconds`` (due → start, on ``started``) and ``duration_seconds`` (start →
end, when a run finishes) as record attributes, so a JSON formatter
(``thread-effects serve --log-format json``) emits them as keys.

**Spans.** Only ``opentelemetry-api`` is used: without an SDK configured by the
application, every span is a no-op and nothing is exported. When a run is scheduled, the
scheduler's current span context (a turn, a tool call, an HTTP request, another effect) is
captured as W3C trace-context text (`capture_context`) and stored with the run through the
storage contract, so it survives a restart. Each attempt of the run gets a span
(`run_span`) named ``effect <name>``, a child of that context — one trace holds "this
message → this tool → this effect, 1 h later" — and linked to it, with the attributes
``thread_effects.thread_id``, ``.run_id``, ``.effect``, ``.attempt`` and ``.outcome``
(completed, failed, interrupted). The span is current while the effect runs, so what the
effect schedules is in turn linked to it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from runtime.effects import EffectRun
from runtime.events import EffectChanged, RunChange, ThreadEvent

run_log = logging.getLogger("runtime.runs")
"""Where run transitions are logged (one INFO line each)."""

TRACER_NAME = "thread-effects"
"""The instrumentation scope of the runtime's spans."""

MAX_TRACE_CONTEXT_CHARS = 1024
"""A captured trace context longer than this (an oversized ``tracestate``) is not stored."""

_PROPAGATOR = TraceContextTextMapPropagator()


def log_run_change(event: ThreadEvent) -> None:
    """Log one run transition (a change-hub listener; messages are not logged)."""
    if not isinstance(event, EffectChanged) or not run_log.isEnabledFor(logging.INFO):
        return
    run = event.run
    change = event.change
    lag: float | None = None
    duration: float | None = None
    if change is RunChange.STARTED and run.started_at_ts is not None:
        lag = max(0.0, run.started_at_ts - run.run_at_ts)
    if run.finished_at_ts is not None and run.started_at_ts is not None:
        duration = max(0.0, run.finished_at_ts - run.started_at_ts)
    text = f"run {run.id} of thread {run.thread_id}: {run.name} {change}"
    if run.canceled_by is not None:
        text += f" by {run.canceled_by[:100]}"
    if change is RunChange.STARTED:
        text += f" (attempt {run.attempts}, lag {lag or 0.0:.3f} s)"
    elif duration is not None:
        text += f" after {duration:.3f} s (attempt {run.attempts})"
    if run.error is not None:
        text += f": {run.error[:500]}"
    level = logging.WARNING if change is RunChange.FAILED else logging.INFO
    run_log.log(
        level,
        text,
        extra={
            "thread_id": run.thread_id,
            "run_id": run.id,
            "effect": run.name,
            "status": str(run.status),
            "change": str(change),
            "attempt": run.attempts,
            "lag_seconds": lag,
            "duration_seconds": duration,
            "key": run.key,
            "canceled_by": run.canceled_by,
        },
    )


def capture_context() -> str | None:
    """The current span context as trace-context JSON text, or None when there is none.

    Returns:
        ``'{"traceparent": "00-<trace id>-<span id>-<flags>"}'`` (with ``tracestate`` when
        set), or None when no valid span is current (no SDK configured, or no span open).
    """
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    text = json.dumps(carrier, separators=(",", ":"), sort_keys=True)
    return text if len(text) <= MAX_TRACE_CONTEXT_CHARS else None


def _scheduler_context(text: str | None) -> otel_context.Context | None:
    if not text:
        return None
    try:
        carrier = json.loads(text)
    except ValueError:
        return None
    if not isinstance(carrier, dict):
        return None
    ctx = _PROPAGATOR.extract({str(k): str(v) for k, v in carrier.items()})
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


_NO_OP_PROVIDERS = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
"""The tracer providers OpenTelemetry gives when no SDK is installed: their spans record nothing."""


class _NoSpan(AbstractContextManager[Span]):
    """`run_span`'s block when there is nothing to trace: the invalid span, no context.

    A class rather than a generator: it is entered once per run.
    """

    __slots__ = ("_token",)

    def __enter__(self) -> Span:
        # Keep what a span would make current: nothing, not what the worker happens to have.
        self._token = otel_context.attach(_EMPTY_CONTEXT)
        return trace.INVALID_SPAN

    def __exit__(self, *exc_info: object) -> None:
        otel_context.detach(self._token)


_EMPTY_CONTEXT = otel_context.Context()


def run_span(run: EffectRun) -> AbstractContextManager[Span]:
    """A span for one attempt of ``run``, current inside the ``with`` block.

    Its parent and link are the context the run was scheduled in (``run.trace_context``),
    if any; without one it is a root span. Set the outcome with `end_run_span`.
    """
    if run.trace_context is None and isinstance(trace.get_tracer_provider(), _NO_OP_PROVIDERS):
        # No SDK installed and nothing to continue: the span would be the invalid one.
        # Skip building it (attributes, links, the tracer lookup).
        return _NoSpan()
    return _recorded_span(run)


@contextmanager
def _recorded_span(run: EffectRun) -> Iterator[Span]:
    parent = _scheduler_context(run.trace_context)
    links = [Link(trace.get_current_span(parent).get_span_context())] if parent else []
    tracer = trace.get_tracer(TRACER_NAME)
    # Without a scheduling context the span must not nest under whatever is current in the
    # worker (nothing should be, but a root span says so).
    ctx = parent if parent is not None else otel_context.Context()
    with tracer.start_as_current_span(
        f"effect {run.name}",
        context=ctx,
        kind=SpanKind.INTERNAL,
        links=links,
        attributes={
            "thread_effects.thread_id": run.thread_id,
            "thread_effects.run_id": run.id,
            "thread_effects.effect": run.name,
            "thread_effects.attempt": run.attempts,
        },
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def end_run_span(span: Span, outcome: str, error: str | None = None) -> None:
    """Record an attempt's outcome (completed, failed, canceled, interrupted) on its span."""
    if span is trace.INVALID_SPAN:
        return  # nothing records it
    span.set_attribute("thread_effects.outcome", outcome)
    if outcome == "failed":
        span.set_status(Status(StatusCode.ERROR, error))
