"""What metrics, spans, run logs, attempts and the run index see of the less common runs:
runs of concurrent effects, runs canceled while running, runs re-queued by a shutdown,
runs of a paused thread, and bulk cancels (which cancel as a single cancel does)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from conftest import Api, serve_api
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from runtime import EffectStatus, Runtime, ThreadState
from runtime.testing import FakeClock

APP = Path(__file__).parent / "apps" / "scheduling"

@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async with serve_api(tmp_path / "data", clock=FakeClock(), app_dir=APP) as running:
        yield running


def release(rt: Runtime, effect: str, key: str) -> None:
    """Let the test app's ``hold`` or ``long_work`` run with args ``{"key": key}`` end."""
    gates: dict[str, asyncio.Event] = rt.registry.app[effect].fn.__globals__["GATES"]
    gates.setdefault(key, asyncio.Event()).set()


async def started(log: Path, key: str) -> None:
    """Wait (bounded, a hang guard) until the effect's code logged ``<key> started``."""
    for _ in range(2000):
        if log.exists() and f"{key} started" in log.read_text().splitlines():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{key} never started (see {log})")


async def scrape(api: Api) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    res = await api.client.get("/metrics")
    assert res.status_code == 200, res.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(res.text)
        for s in family.samples
    }


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
          **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def outcomes(exporter: InMemorySpanExporter, run_id: str) -> list[str]:
    found: list[ReadableSpan] = [
        s for s in exporter.get_finished_spans()
        if (s.attributes or {}).get("thread_effects.run_id") == run_id
    ]
    return [str((s.attributes or {}).get("thread_effects.outcome")) for s in found]


async def attempts(thread: ThreadState, run_id: str) -> list[tuple[int, str]]:
    return [(a.attempt, a.outcome) for a in await thread.get_run_attempts(run_id)]


async def test_a_concurrent_run_and_a_run_canceled_while_running_are_observed(
    api: Api, tmp_path: Path, spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="runtime.runs")
    data = tmp_path / "data"
    rt = api.rt
    thread = await rt.create_thread()
    held = await thread.schedule_effect("hold", {"key": "inline"})
    beside = await thread.schedule_effect("long_work", {"key": "beside"})
    await started(data / "hold.log", "inline")
    await started(data / "long_work.log", "beside")

    running = await scrape(api)
    assert value(running, "thread_effects_running_runs") == 2  # in line and beside it
    assert value(running, "thread_effects_run_attempts_total", effect="long_work") == 1
    page = await rt.list_runs(status="running")
    assert {r.id for r in page.runs} == {held, beside}

    assert await thread.remove_scheduled_effect(held, canceled_by="ops")
    release(rt, "long_work", "beside")
    await rt.wait_idle()

    m = await scrape(api)
    assert value(m, "thread_effects_running_runs") == 0
    assert value(m, "thread_effects_runs_total", effect="hold", status="canceled") == 1
    assert value(m, "thread_effects_runs_total", effect="long_work", status="completed") == 1
    assert value(m, "thread_effects_run_duration_seconds_count",
                 effect="long_work", status="completed") == 1

    listed = {r.id: r for r in (await rt.list_runs()).runs}
    assert (listed[held].status, listed[held].canceled_by) == (EffectStatus.CANCELED, "ops")
    assert listed[beside].status is EffectStatus.COMPLETED
    assert await attempts(thread, held) == [(1, "canceled")]
    assert await attempts(thread, beside) == [(1, "completed")]
    assert outcomes(spans, held) == ["canceled"]
    assert outcomes(spans, beside) == ["completed"]
    lines = [r.getMessage() for r in caplog.records if r.name == "runtime.runs"]
    assert f"run {held} of thread {thread.thread_id}: hold canceled by ops" in "\n".join(lines)
    [record] = [r for r in caplog.records
                if r.name == "runtime.runs" and getattr(r, "run_id", None) == held
                and getattr(r, "change", None) == "canceled"]
    assert getattr(record, "canceled_by", None) == "ops"


async def test_a_concurrent_run_requeued_by_a_shutdown_is_indexed_and_its_attempts_kept(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    clock = FakeClock()
    data = tmp_path / "data"
    async with Runtime(app_dir=APP, data_dir=data, clock=clock, load_packages=False,
                       shutdown_grace_seconds=0) as rt:
        thread = await rt.create_thread("t")
        long = await thread.schedule_effect("long_work", {"key": "r"}, key="report")
        await started(data / "long_work.log", "r")
    assert outcomes(spans, long) == ["interrupted"]
    async with Runtime(app_dir=APP, data_dir=data, clock=clock, load_packages=False) as rt:
        [indexed] = (await rt.list_runs()).runs
        # Pending again (the start re-queues nothing more: the shutdown did); the key kept.
        assert (indexed.id, indexed.key, indexed.attempts) == (long, "report", 1)
        assert indexed.status in (EffectStatus.PENDING, EffectStatus.RUNNING)
        release(rt, "long_work", "r")
        await rt.wait_idle()
        thread = await rt.get_thread("t")
        assert await attempts(thread, long) == [(1, "interrupted"), (2, "completed")]
        [indexed] = (await rt.list_runs()).runs
        assert (indexed.status, indexed.attempts) == (EffectStatus.COMPLETED, 2)
    assert outcomes(spans, long) == ["interrupted", "completed"]


async def test_runs_of_a_paused_thread_stay_pending_and_a_bulk_cancel_says_who(
    api: Api,
) -> None:
    rt = api.rt
    assert api.clock is not None
    paused = await rt.create_thread(user_id="u")
    other = await rt.create_thread(user_id="u")
    await paused.pause()
    waiting = await paused.schedule_effect("ping", None, 0)
    later = await other.schedule_effect("ping", None, 3600)
    api.clock.advance(5)
    await rt.wait_idle()
    assert (await paused.get_run(waiting)).status is EffectStatus.PENDING

    m = await scrape(api)
    assert value(m, "thread_effects_pending_runs") == 2
    page = await rt.list_runs(status="pending", user_id="u")
    assert {r.id for r in page.runs} == {waiting, later}

    res = await api.client.post("/api/runs/cancel", json={"user_id": "u", "by": "cleanup"})
    assert res.status_code == 200, res.text
    body = res.json()
    assert (body["canceled"], sorted(body["ids"]), body["more"]) == (
        2, sorted([waiting, later]), False
    )
    for thread, run_id in ((paused, waiting), (other, later)):
        run = await thread.get_run(run_id)
        assert (run.status, run.canceled_by) == (EffectStatus.CANCELED, "cleanup")
    res = await api.client.get("/api/runs", params={"status": "canceled"})
    assert {r["canceledBy"] for r in res.json()["runs"]} == {"cleanup"}
    assert value(await scrape(api), "thread_effects_pending_runs") == 0

    # Without "by" the API says "http"; a bad one is refused before anything is canceled.
    again = await other.schedule_effect("ping", None, 3600)
    res = await api.client.post("/api/runs/cancel", json={"by": "x" * 257})
    assert res.status_code == 400, res.text
    assert "canceled_by" in res.json()["error"]["message"]
    assert (await other.get_run(again)).status is EffectStatus.PENDING
    res = await api.client.post("/api/runs/cancel", json={"thread_id": other.thread_id})
    assert res.json()["ids"] == [again]
    assert (await other.get_run(again)).canceled_by == "http"
    with pytest.raises(ValueError, match="canceled_by"):
        await rt.cancel_runs(canceled_by="")
