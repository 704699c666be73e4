"""Prometheus metrics of a runtime and its server, served at ``GET /metrics``.

`RuntimeMetrics` keeps its own `prometheus_client.CollectorRegistry` (never the process
global one), so several runtimes in one process — tests, or two apps — never collide.
It observes runs and messages through the change hub's listener interface
(`runtime.frames.ChangeHub.add_listener`): the core counts nothing itself and imports
neither this module nor ``prometheus_client`` (the layering rule of docs/design.md).
Gauges (open threads, threads with an alarm, running runs, pending runs) are read from
the runtime when scraped. The HTTP layer adds the WebSocket figures (`RuntimeMetrics.ws_clients`,
`RuntimeMetrics.frames_dropped`).

Every metric is named ``thread_effects_*``; docs/operations.md lists them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from runtime.effects import EffectStatus
from runtime.events import EffectChanged, MessageCreated, RunChange, ThreadEvent
from runtime.messages import MessageRole

if TYPE_CHECKING:
    from runtime.supervisor import Runtime

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The content type of the text exposition format."""

LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
               60.0, 300.0, 3600.0)
"""Due → start lag buckets, in seconds (a run due while the server was down starts late)."""

DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                    60.0, 300.0, 900.0)
"""Run duration buckets, in seconds."""


class _RuntimeGauges(Collector):
    """The gauges read from the runtime at scrape time."""

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self.pending: int | None = None  # read from the run index before each scrape

    def collect(self) -> Iterator[GaugeMetricFamily]:
        rt = self._rt
        if self.pending is not None:
            yield GaugeMetricFamily(
                "thread_effects_pending_runs",
                "Pending runs across every thread (from the run index).",
                value=self.pending,
            )
        yield GaugeMetricFamily(
            "thread_effects_open_threads",
            "Threads whose store is open in this process (the actor table's LRU).",
            value=rt.actors.open_count,
        )
        yield GaugeMetricFamily(
            "thread_effects_threads_with_alarm",
            "Threads with an alarm set: a pending or running run (or a canceled one whose "
            "alarm has not gone off yet; it then goes off and finds nothing).",
            value=rt.alarms.armed_count,
        )
        yield GaugeMetricFamily(
            "thread_effects_running_runs",
            "Runs executing now (runs of concurrent effects included).",
            value=sum(
                (a.current_run is not None) + len(a.side_runs) for a in rt.actors.open_actors()
            ),
        )


class RuntimeMetrics:
    """The metrics of one runtime, in a registry of their own.

    Args:
        runtime: The runtime to observe (its hub's events are counted from now on).

    Attributes:
        registry: The `prometheus_client.CollectorRegistry` holding every metric here.
        ws_clients: Gauge of connected WebSocket stream clients (the HTTP layer sets it).
        frames_dropped: Counter of frames never sent because a client read too slowly and
            was closed (1013), or its subscription overflowed.
    """

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.runs_scheduled = Counter(
            "thread_effects_runs_scheduled", "Runs scheduled (replays included), by effect.",
            ["effect"], registry=r,
        )
        self.runs_finished = Counter(
            "thread_effects_runs", "Runs that reached a final status, by effect and status "
            "(completed, failed, canceled).", ["effect", "status"], registry=r,
        )
        self.attempts = Counter(
            "thread_effects_run_attempts", "Run attempts started, by effect.", ["effect"],
            registry=r,
        )
        self.requeued = Counter(
            "thread_effects_runs_requeued", "Interrupted runs returned to pending (restart, "
            "shutdown), by effect.", ["effect"], registry=r,
        )
        self.lag = Histogram(
            "thread_effects_run_lag_seconds", "Due → start lag of each attempt, in seconds.",
            ["effect"], buckets=LAG_BUCKETS, registry=r,
        )
        self.duration = Histogram(
            "thread_effects_run_duration_seconds", "Start → end of a run's last attempt, in "
            "seconds, by effect and final status.", ["effect", "status"],
            buckets=DURATION_BUCKETS, registry=r,
        )
        self.turns = Counter(
            "thread_effects_turns", "Conversation turns started (a user message sent; a "
            "turn resumed after a restart is not counted again).",
            registry=r,
        )
        self.tool_calls = Counter(
            "thread_effects_tool_calls", "Tool calls run in turns, by tool and outcome "
            "(ok, error); a result replayed from a turn's journal is not counted.",
            ["tool", "outcome"], registry=r,
        )
        self.ws_clients = Gauge(
            "thread_effects_websocket_clients", "Connected WebSocket stream clients.",
            registry=r,
        )
        self.frames_dropped = Counter(
            "thread_effects_frames_dropped", "Frames never sent: their client read too "
            "slowly and was closed.", registry=r,
        )
        self._gauges = _RuntimeGauges(runtime)
        r.register(self._gauges)
        runtime.hub.add_listener(self.observe)

    def observe(self, event: ThreadEvent) -> None:
        """Count one hub event (the hub calls this for every event of every thread)."""
        if isinstance(event, EffectChanged):
            self._run_changed(event)
        elif isinstance(event, MessageCreated):
            message = event.message
            if message.role is MessageRole.USER and message.run_id and not message.injected:
                self.turns.inc()
            elif message.role is MessageRole.TOOL:
                for result in message.tool_results:
                    if result.from_journal:
                        continue  # recorded by an earlier attempt: the tool did not run
                    self.tool_calls.labels(
                        result.tool_name, "error" if result.is_error else "ok"
                    ).inc()

    def _run_changed(self, event: EffectChanged) -> None:
        run = event.run
        change = event.change
        if change is RunChange.SCHEDULED:
            self.runs_scheduled.labels(run.name).inc()
        elif change is RunChange.STARTED:
            self.attempts.labels(run.name).inc()
            if run.started_at_ts is not None:
                self.lag.labels(run.name).observe(max(0.0, run.started_at_ts - run.run_at_ts))
        elif change is RunChange.REQUEUED:
            self.requeued.labels(run.name).inc()
        elif run.status.finished:
            status = str(run.status)
            self.runs_finished.labels(run.name, status).inc()
            if (
                run.status is not EffectStatus.CANCELED
                and run.started_at_ts is not None
                and run.finished_at_ts is not None
            ):
                self.duration.labels(run.name, status).observe(
                    max(0.0, run.finished_at_ts - run.started_at_ts)
                )

    def close(self) -> None:
        """Stop observing the runtime's hub."""
        self.runtime.hub.remove_listener(self.observe)

    async def refresh(self) -> None:
        """Read what the gauges need from the stores (off the event loop); before a scrape.

        Raises:
            RuntimeClosed: the runtime is not running (the gauge is then left out).
        """
        self._gauges.pending = None
        page = await self.runtime.list_runs(status="pending", limit=1)
        self._gauges.pending = page.counts[EffectStatus.PENDING]

    def exposition(self) -> bytes:
        """Every metric in the Prometheus text format (`CONTENT_TYPE`)."""
        return generate_latest(self.registry)
