"""``GET /metrics`` (Prometheus) and the probes ``/api/health`` and ``/api/ready``.

The figures are read back with prometheus_client's own parser after a known sequence of
runs on the test app, under a fake clock (lag and duration are exact).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from conftest import Api, release, serve_api
from prometheus_client.parser import text_string_to_metric_families

from runtime.testing import FakeClock

pytestmark = pytest.mark.usefixtures("no_blocking")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(api: Api, **headers: str) -> Samples:
    res = await api.client.get("/metrics", headers=headers)
    assert res.status_code == 200, res.text
    assert res.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(res.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def wait_status(api: Api, tid: str, run_id: str, status: str) -> None:
    for _ in range(2000):
        if (await api.run(tid, run_id))["status"] == status:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"run {run_id} never became {status}")


async def test_metrics_after_a_known_sequence_of_runs(api: Api) -> None:
    assert api.clock is not None
    tid = await api.new_thread()
    other = await api.new_thread()
    await api.schedule(tid, "ping")
    await api.schedule(other, "ping")
    await api.schedule(tid, "boom", {"message": "no"})
    await api.rt.wait_idle()
    late = await api.schedule(tid, "note", {"text": "late"}, delay_seconds=10)
    canceled = await api.schedule(other, "ping", delay_seconds=3600)
    res = await api.client.post(f"/api/threads/{other}/effects/{canceled}/cancel")
    assert res.json() == {"canceled": True}

    before = await scrape(api)
    # `late`; the canceled run's alarm stays until it goes off (and finds nothing).
    assert value(before, "thread_effects_threads_with_alarm") == 2
    assert value(before, "thread_effects_pending_runs") == 1

    api.clock.advance(25)  # `late` starts 15 s after it was due
    await api.rt.wait_idle()
    assert (await api.run(tid, late))["status"] == "completed"

    held = await api.schedule(tid, "hold", {"key": "metrics"})
    await wait_status(api, tid, held, "running")
    running = await scrape(api)
    assert value(running, "thread_effects_running_runs") == 1
    api.clock.advance(2)  # it runs 2 s
    release(api.rt, "metrics")
    await api.rt.wait_idle()

    m = await scrape(api)
    assert value(m, "thread_effects_runs_total", effect="ping", status="completed") == 2
    assert value(m, "thread_effects_runs_total", effect="boom", status="failed") == 1
    assert value(m, "thread_effects_runs_total", effect="ping", status="canceled") == 1
    assert value(m, "thread_effects_runs_total", effect="note", status="completed") == 1
    assert value(m, "thread_effects_runs_total", effect="hold", status="completed") == 1
    assert value(m, "thread_effects_runs_scheduled_total", effect="ping") == 3
    assert value(m, "thread_effects_run_attempts_total", effect="ping") == 2
    assert value(m, "thread_effects_run_attempts_total", effect="boom") == 1

    # Due → start lag: `late` started 15 s late, every other run on time.
    assert value(m, "thread_effects_run_lag_seconds_count", effect="note") == 1
    assert value(m, "thread_effects_run_lag_seconds_sum", effect="note") == 15
    assert value(m, "thread_effects_run_lag_seconds_bucket", effect="note", le="10.0") == 0
    assert value(m, "thread_effects_run_lag_seconds_bucket", effect="note", le="30.0") == 1
    assert value(m, "thread_effects_run_lag_seconds_sum", effect="ping") == 0

    # Duration: `hold` ran 2 s; a canceled run has none.
    assert value(m, "thread_effects_run_duration_seconds_sum",
                 effect="hold", status="completed") == 2
    assert value(m, "thread_effects_run_duration_seconds_bucket",
                 effect="hold", status="completed", le="1.0") == 0
    assert value(m, "thread_effects_run_duration_seconds_bucket",
                 effect="hold", status="completed", le="2.5") == 1
    assert value(m, "thread_effects_run_duration_seconds_count",
                 effect="boom", status="failed") == 1
    assert value(m, "thread_effects_run_duration_seconds_count",
                 effect="ping", status="canceled") == 0

    assert value(m, "thread_effects_threads_with_alarm") == 1  # the canceled run's
    assert value(m, "thread_effects_pending_runs") == 0
    assert value(m, "thread_effects_running_runs") == 0
    assert value(m, "thread_effects_open_threads") == 2
    assert value(m, "thread_effects_websocket_clients") == 0
    assert value(m, "thread_effects_frames_dropped_total") == 0


async def test_two_runtimes_in_one_process_count_apart(tmp_path: Path) -> None:
    async with (
        serve_api(tmp_path / "a", clock=FakeClock()) as a,
        serve_api(tmp_path / "b", clock=FakeClock()) as b,
    ):
        tid = await a.new_thread()
        await a.schedule(tid, "ping")
        await a.rt.wait_idle()
        assert value(await scrape(a), "thread_effects_runs_total",
                     effect="ping", status="completed") == 1
        assert value(await scrape(b), "thread_effects_runs_total",
                     effect="ping", status="completed") == 0


async def test_metrics_need_the_token_and_the_probes_do_not(tmp_path: Path) -> None:
    async with serve_api(tmp_path / "data", clock=FakeClock(), api_token="s3cret") as api:
        res = await api.client.get("/metrics")
        assert res.status_code == 401 and res.json()["error"]["code"] == "unauthorized"
        m = await scrape(api, authorization="Bearer s3cret")
        assert value(m, "thread_effects_open_threads") == 0
        res = await api.client.get("/api/health")
        assert res.status_code == 200
        assert res.json() == {"status": "ok", "backend": "sqlite", "databaseConnected": None,
                              "nodeId": api.rt.node_id}
        res = await api.client.get("/api/ready")
        assert res.status_code == 200 and res.json() == {"status": "ready"}


async def test_ready_says_503_once_the_runtime_stops(tmp_path: Path) -> None:
    async with serve_api(tmp_path / "data", clock=FakeClock()) as api:
        await api.rt.close()
        res = await api.client.get("/api/ready")
        assert res.status_code == 503
        assert res.json()["error"]["code"] == "not_ready"
        assert "not running" in res.json()["error"]["message"]
        res = await api.client.get("/api/health")
        assert res.status_code == 200
