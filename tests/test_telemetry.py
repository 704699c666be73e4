"""Spans of run attempts (linked to what scheduled them, across a restart) and run logs.

Spans are recorded with the OpenTelemetry SDK's in-memory exporter, installed once for
the test process (the SDK is a test dependency only; the runtime uses the API).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from conftest import DEMO_APP, serve_api
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from runtime import Runtime
from runtime.testing import FakeClock

APP = Path(__file__).parent / "apps" / "core"

def effect_spans(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == f"effect {name}"]


def runtime(data_dir: Path, clock: FakeClock) -> Runtime:
    return Runtime(app_dir=APP, data_dir=data_dir, clock=clock, load_packages=False,
                   extensions=[])


async def test_a_run_is_a_child_of_the_span_that_scheduled_it_across_a_restart(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    tracer = trace.get_tracer("test")
    clock = FakeClock()
    async with runtime(tmp_path / "data", clock) as rt:
        thread = await rt.create_thread()
        with tracer.start_as_current_span("tool call") as scheduling:
            run_id = await thread.schedule_effect("record", {"key": "later"}, delay=3600)
        scheduler = scheduling.get_span_context()
    assert effect_spans(spans, "record") == []  # not run yet

    # A new process: the scheduling context comes back from the store.
    clock.advance(3600)
    async with runtime(tmp_path / "data", clock) as rt:
        await rt.wait_idle()
        run = await (await rt.get_thread(thread.thread_id)).get_run(run_id)
        assert run.status == "completed"

    (span,) = effect_spans(spans, "record")
    assert span.context.trace_id == scheduler.trace_id  # one trace: tool call → effect
    assert span.parent is not None and span.parent.span_id == scheduler.span_id
    assert [link.context.span_id for link in span.links] == [scheduler.span_id]
    assert span.attributes is not None
    assert dict(span.attributes) == {
        "thread_effects.thread_id": thread.thread_id,
        "thread_effects.run_id": run_id,
        "thread_effects.effect": "record",
        "thread_effects.attempt": 1,
        "thread_effects.outcome": "completed",
    }
    assert span.status.status_code is StatusCode.UNSET


async def test_an_effect_scheduled_by_an_effect_is_its_child_and_failures_are_errors(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    async with runtime(tmp_path / "data", FakeClock()) as rt:
        thread = await rt.create_thread()
        await thread.schedule_effect("chain", {"key": "next"})  # no span current: a root
        await thread.schedule_effect("boom", {"message": "bad"})
        await rt.wait_idle()

    (chain,) = effect_spans(spans, "chain")
    (record,) = effect_spans(spans, "record")
    (boom,) = effect_spans(spans, "boom")
    assert chain.parent is None and chain.links == ()
    assert record.parent is not None and record.parent.span_id == chain.context.span_id
    assert record.context.trace_id == chain.context.trace_id
    assert boom.attributes is not None and boom.attributes["thread_effects.outcome"] == "failed"
    assert boom.status.status_code is StatusCode.ERROR
    assert "bad" in (boom.status.description or "")


async def test_an_http_request_is_the_parent_of_what_it_schedules(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    caller = f"00-{trace_id}-b7ad6b7169203331-01"
    async with serve_api(tmp_path / "data", clock=FakeClock()) as api:
        tid = await api.new_thread()
        res = await api.client.post(
            f"/api/threads/{tid}/effects", json={"name": "ping"},
            headers={"traceparent": caller},
        )
        assert res.status_code == 201
        await api.rt.wait_idle()

    (request,) = [
        s for s in spans.get_finished_spans()
        if s.name == "HTTP POST" and s.attributes
        and s.attributes["url.path"] == f"/api/threads/{tid}/effects"
    ]
    assert format(request.context.trace_id, "032x") == trace_id
    assert request.attributes is not None
    assert request.attributes["http.response.status_code"] == 201
    (ping,) = effect_spans(spans, "ping")
    assert ping.parent is not None and ping.parent.span_id == request.context.span_id
    assert format(ping.context.trace_id, "032x") == trace_id


async def test_one_log_line_per_run_transition_with_its_fields(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    caplog.set_level(logging.INFO, logger="runtime.runs")
    async with runtime(tmp_path / "data", clock) as rt:
        thread = await rt.create_thread()
        run_id = await thread.schedule_effect("record", {"key": "k"}, delay=10)
        clock.advance(12)
        await rt.wait_idle()
    lines = [r for r in caplog.records if r.name == "runtime.runs"]
    assert [r.__dict__["change"] for r in lines] == ["scheduled", "started", "completed"]
    for r in lines:
        assert r.__dict__["thread_id"] == thread.thread_id
        assert r.__dict__["run_id"] == run_id and r.__dict__["effect"] == "record"
    started, completed = lines[1], lines[2]
    assert started.__dict__["attempt"] == 1 and started.__dict__["lag_seconds"] == 2
    assert started.__dict__["status"] == "running"
    assert completed.__dict__["status"] == "completed"
    assert completed.__dict__["duration_seconds"] == 0
    assert "record started (attempt 1, lag 2.000 s)" in started.getMessage()
    json.dumps({k: started.__dict__[k] for k in ("lag_seconds", "duration_seconds")})


async def test_a_message_its_tool_call_and_the_effect_an_hour_later_are_one_trace(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    clock = FakeClock()
    async with serve_api(tmp_path / "data", clock=clock, app_dir=DEMO_APP) as api:
        tid = await api.new_thread()
        res = await api.client.post(
            f"/api/threads/{tid}/messages", json={"content": "remind me in 1 hour to stretch"}
        )
        assert res.status_code == 200, res.text
        clock.advance(3600)
        await api.rt.wait_idle()
        metrics = (await api.client.get("/metrics")).text

    by_name = {s.name: s for s in spans.get_finished_spans()}
    request = next(
        s for s in spans.get_finished_spans()
        if s.name == "HTTP POST" and s.attributes
        and s.attributes["url.path"] == f"/api/threads/{tid}/messages"
    )
    turn, tool, effect = by_name["turn"], by_name["tool set_reminder"], by_name[
        "effect send_reminder"
    ]
    assert turn.parent is not None and turn.parent.span_id == request.context.span_id
    assert tool.parent is not None and tool.parent.span_id == turn.context.span_id
    assert effect.parent is not None and effect.parent.span_id == tool.context.span_id
    assert {s.context.trace_id for s in (request, turn, tool, effect)} == {
        request.context.trace_id
    }
    assert effect.start_time is not None and tool.end_time is not None
    assert effect.attributes is not None
    assert effect.attributes["thread_effects.outcome"] == "completed"
    # The same sequence, counted.
    assert "thread_effects_turns_total 1.0" in metrics
    assert 'thread_effects_tool_calls_total{outcome="ok",tool="set_reminder"} 1.0' in metrics


_LATE_PROVIDER = """
import asyncio, json, sys
from pathlib import Path
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from runtime import Runtime

async def main():
    counts = []
    exporter = InMemorySpanExporter()
    async with Runtime(app_dir=Path(sys.argv[1]), data_dir=Path(sys.argv[2]),
                       load_packages=False, extensions=[]) as rt:
        thread = await rt.create_thread()
        await thread.schedule_effect("record", {"key": "a"})
        await rt.wait_idle()
        counts.append(len(exporter.get_finished_spans()))
        if sys.argv[3] == "set":
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            trace.set_tracer_provider(provider)
        else:
            trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(exporter))
        await thread.schedule_effect("record", {"key": "a"})
        await rt.wait_idle()
        counts.append(len(exporter.get_finished_spans()))
    print(json.dumps(counts))

asyncio.run(main())
"""


@pytest.mark.parametrize("how", ["set", "env"])
def test_runs_are_traced_once_a_provider_is_installed_even_after_the_runtime_started(
    tmp_path: Path, how: str
) -> None:
    """A process with no SDK provider records no spans; one installed later (in code, or
    named by ``OTEL_PYTHON_TRACER_PROVIDER`` before start) traces the next runs."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("OTEL_PYTHON_TRACER_PROVIDER", None)
    if how == "env":
        env["OTEL_PYTHON_TRACER_PROVIDER"] = "sdk_tracer_provider"
    done = subprocess.run(
        [sys.executable, "-c", _LATE_PROVIDER, str(APP), str(tmp_path / "data"), how],
        capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    before, after = json.loads(done.stdout.strip().splitlines()[-1])
    # "env": the provider is the SDK's from the start; its processor is added after the
    # first run, so only the second run's span reaches the exporter either way.
    assert (before, after) == (0, 1)
